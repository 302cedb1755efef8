"""The `minite` torch.compile backend (entry point `torch_dynamo_backends: minite`).

Not implemented yet: the pass pipeline (passes/) and the NVFP4 ops (codegen/) it lowers to are
separate pieces of work. Until they land this backend refuses clearly instead of compiling
something that is not NVFP4.
"""

from __future__ import annotations


def minite_backend(gm, example_inputs, **kwargs):
    raise NotImplementedError(
        "torch.compile(backend='minite') is not implemented yet: it needs the pass pipeline "
        "(fp4_compile.passes: select / lower linears / lower MoE / invariance / verify) and the "
        "fp4_compile:: NVFP4 ops from fp4_compile.codegen. Use fp4_compile.quantize / nvfp4_mm "
        "(the reference numerics) meanwhile."
    )
