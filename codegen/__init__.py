"""Triton kernels, their launchers and the `fp4_compile::` ops, imported as `fp4_compile.codegen`.
Families nvfp4/, invariant/, moe/; shared: runtime, configs (every launch config), triton_helpers.
May import the core (never `rl`), Triton only lazily (`*_kernel*.py`); importing registers the ops.
"""

from . import invariant, moe, nvfp4  # noqa: F401  (register the ops)
from .invariant.api import attention, linear, logprobs, mm, rms_norm, route, sort_by_expert
from .nvfp4.api import (
    nvfp4_grouped_linear,
    nvfp4_linear,
    ongrid_weight,
    quantize_into,
    quantize_op,
    quantize_weight,
)

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
    "quantize_into",
    "quantize_op",
    "quantize_weight",
]
