"""The GPU tests' imports from below the public API, kept in this one module.

When a module below moves, repoint its import here and nowhere else. Triton kernel modules are
imported on first use, so collecting the GPU tests needs no Triton.
"""

from fp4_compile.backend import lowering_only_backend  # noqa: F401
from fp4_compile.codegen.invariant import reference as invariant_reference  # noqa: F401
from fp4_compile.codegen.nvfp4 import gemm as nvfp4_gemm  # noqa: F401
from fp4_compile.codegen.nvfp4 import linear as nvfp4_linear_op  # noqa: F401
from fp4_compile.rl.diagnostics.localize import (  # noqa: F401
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
    """The BF16 batch-invariant linear kernel's launcher (codegen/invariant/linear_kernel.py)."""
    from fp4_compile.codegen.invariant.linear_kernel import linear

    return linear(*args, **kwargs)


def launch_gemm(*args, **kwargs):
    """The W4A4 GEMM's launcher (codegen/nvfp4/gemm_kernel.py)."""
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm as launch

    return launch(*args, **kwargs)


def rms_norm_quantize_kernel(*args, **kwargs):
    """The RMSNorm + NVFP4 operand kernel's launcher (codegen/nvfp4/rms_norm_quantize_kernel.py)."""
    from fp4_compile.codegen.nvfp4.rms_norm_quantize_kernel import rms_norm_quantize

    return rms_norm_quantize(*args, **kwargs)


def add_rms_norm_quantize_kernel(*args, **kwargs):
    """Its residual form, h = x + residual in the same launch (the same module)."""
    from fp4_compile.codegen.nvfp4.rms_norm_quantize_kernel import add_rms_norm_quantize

    return add_rms_norm_quantize(*args, **kwargs)


def rms_norm_kernel(*args, **kwargs):
    """The batch-invariant RMSNorm kernel's launcher (codegen/invariant/rms_norm_kernel.py)."""
    from fp4_compile.codegen.invariant.rms_norm_kernel import rms_norm

    return rms_norm(*args, **kwargs)


def quantize_transposed_ongrid(*args, **kwargs):
    """The wgrad's X^T quantize (codegen/nvfp4/gemm.py)."""
    from fp4_compile.codegen.nvfp4.gemm import quantize_transposed_ongrid as launch

    return launch(*args, **kwargs)


def launch_decode_gemm(*args, **kwargs):
    """The few-row packed GEMM's launcher (codegen/nvfp4/decode_gemm_kernel.py)."""
    from fp4_compile.codegen.nvfp4.decode_gemm_kernel import launch_decode_gemm as launch

    return launch(*args, **kwargs)


def fusion_passes():
    """The passes that share and fuse activation quantization (passes/), by name."""
    from fp4_compile.passes.fuse_quantize_into_producers import fuse_quantize_into_producers
    from fp4_compile.passes.share_activation_quantize import share_activation_quantize

    return {"share": share_activation_quantize, "fuse": fuse_quantize_into_producers}


def silu_mul_quantize_kernel(*args, **kwargs):
    """The SwiGLU + NVFP4 operand kernel's launcher (codegen/nvfp4/silu_mul_quantize_kernel.py)."""
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize

    return silu_mul_quantize(*args, **kwargs)


def silu_mul_kernel(*args, **kwargs):
    """The SwiGLU kernel's launcher (codegen/invariant/silu_mul_kernel.py)."""
    from fp4_compile.codegen.invariant.silu_mul_kernel import silu_mul_triton

    return silu_mul_triton(*args, **kwargs)


def quantize_weight_tiles(*args, **kwargs):
    """The weights' one-read quantize (codegen/nvfp4/weight_quantize_kernel.py)."""
    from fp4_compile.codegen.nvfp4.weight_quantize_kernel import quantize_weight_tiles as launch

    return launch(*args, **kwargs)


def chunk_abs_max(*args, **kwargs):
    """The rows' partial maxima (codegen/nvfp4/abs_max_kernel.py)."""
    from fp4_compile.codegen.nvfp4.abs_max_kernel import chunk_abs_max as launch

    return launch(*args, **kwargs)


def row_codes_from_parts(*args, **kwargs):
    """The split form's row quantize (codegen/nvfp4/row_codes_kernel.py)."""
    from fp4_compile.codegen.nvfp4.row_codes_kernel import row_codes_from_parts as launch

    return launch(*args, **kwargs)
