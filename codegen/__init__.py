"""Triton kernels and their launchers, imported as `fp4_compile.codegen`.

Triton is imported lazily by the kernel modules, never by this package's import. Never imports
`fp4_compile.rl`. Importing this package registers the `fp4_compile::` NVFP4 ops (no Triton).
"""

from . import (  # noqa: F401  (register the ops)
    embedding,
    gather_rows,
    invariant_grouped,
    moe_combine,
    ordered_sum,
    repeat_kv,
    row_scale,
    silu_mul,
)
from .invariant import (
    attention,
    linear,
    logprobs,
    mm,
    rms_norm,
    route,
    sort_by_expert,
)
from .nvfp4 import nvfp4_grouped_mm, nvfp4_linear, ongrid_weight, quantize_op, quantize_weight

__all__ = [
    "attention",
    "linear",
    "logprobs",
    "mm",
    "rms_norm",
    "route",
    "sort_by_expert",
    "nvfp4_grouped_mm",
    "nvfp4_linear",
    "ongrid_weight",
    "quantize_op",
    "quantize_weight",
]
