"""The GPU tests' imports from below the public API, kept in this one module.

When a module below moves, repoint its import here and nowhere else. Triton kernel modules are
imported on first use, so collecting the GPU tests needs no Triton.
"""

from fp4_compile.backend import lowering_only_backend  # noqa: F401
from fp4_compile.codegen.invariant import reference as invariant_reference  # noqa: F401
from fp4_compile.codegen.nvfp4 import gemm as nvfp4_gemm  # noqa: F401
from fp4_compile.codegen.nvfp4 import linear as nvfp4_linear_op  # noqa: F401
from fp4_compile.rl.localize import (  # noqa: F401
    compare_states,
    learner_hidden_states,
    rollout_hidden_states,
)
from fp4_compile.rollout.step import RolloutStep  # noqa: F401
from fp4_compile.sr_stream import set_sr_state, sr_state, sr_uniforms  # noqa: F401


def quantize_triton(*args, **kwargs):
    """The quantize kernel's launcher (codegen/nvfp4/quantize_kernel.py)."""
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton as launch

    return launch(*args, **kwargs)


def grouped_wgrad(*args, **kwargs):
    """The one-pass MoE wgrad kernel's launcher (codegen/nvfp4/grouped_wgrad_kernel.py)."""
    from fp4_compile.codegen.nvfp4.grouped_wgrad_kernel import grouped_wgrad as launch

    return launch(*args, **kwargs)


def invariant_linear_kernel(*args, **kwargs):
    """The BF16 batch-invariant linear kernel's launcher (codegen/invariant/forward_kernels.py)."""
    from fp4_compile.codegen.invariant.forward_kernels import linear

    return linear(*args, **kwargs)


def launch_gemm(*args, **kwargs):
    """The W4A4 GEMM's launcher (codegen/nvfp4/gemm_kernel.py)."""
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm as launch

    return launch(*args, **kwargs)


def launch_decode_gemm(*args, **kwargs):
    """The few-row packed GEMM's launcher (codegen/nvfp4/decode_gemm_kernel.py)."""
    from fp4_compile.codegen.nvfp4.decode_gemm_kernel import launch_decode_gemm as launch

    return launch(*args, **kwargs)
