"""NVFP4: quantize (activations, weights, gradients) and the W4A4 GEMMs (dense, grouped, wgrad).
Layout: api.py, <op>.py (quantize, group_amax, linear, grouped_linear, quantized_linear: a linear
on a shared pre-quantized X, grouped_quantized: the experts' GEMM on one, rms_norm_quantize and
silu_mul_quantize: producers emitting that operand, norm_parts, silu_mul_parts: producers
leaving it to the decode GEMM's prologue, grouped_parts: the experts' GEMM on them,
linear_parts: a linear reading its producer's row maxima), *_kernel.py, gemm.py (shared math).
May import the core, ..runtime, ..configs, ..triton_helpers and ..invariant; never ..moe.
"""

from . import (  # noqa: F401  (register the ops)
    group_amax,
    grouped_linear,
    grouped_parts,
    grouped_quantized,
    linear,
    linear_parts,
    norm_parts,
    quantize,
    quantized_linear,
    rms_norm_quantize,
    silu_mul_parts,
    silu_mul_quantize,
)
