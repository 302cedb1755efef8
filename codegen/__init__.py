"""Triton kernels, their launchers and the `fp4_compile::` ops, imported as `fp4_compile.codegen`.

Families: `nvfp4/` (NVFP4 quantize and GEMMs), `invariant/` (batch-invariant non-NVFP4 ops), `moe/` (MoE glue).
May import the core (`fp4_compile.*`), never `rl`; Triton only lazily. Importing it registers every op.
"""

from . import invariant, moe, nvfp4  # noqa: F401  (register the ops)
from .invariant import attention, linear, logprobs, mm, rms_norm, route, sort_by_expert
from .nvfp4 import nvfp4_grouped_linear, nvfp4_linear, ongrid_weight, quantize_op, quantize_weight

__all__ = [
    "attention",
    "linear",
    "logprobs",
    "mm",
    "rms_norm",
    "route",
    "sort_by_expert",
    "nvfp4_grouped_linear",
    "nvfp4_linear",
    "ongrid_weight",
    "quantize_op",
    "quantize_weight",
]
