"""Triton kernels and their launchers, imported as `fp4_compile.codegen`.

Triton is imported lazily by the kernel modules, never by this package's import. Never imports
`fp4_compile.rl`. Importing this package registers the `fp4_compile::` NVFP4 ops (no Triton).
"""

from . import ordered_sum  # noqa: F401  (registers fp4_compile::ordered_sum)
from .nvfp4 import nvfp4_grouped_mm, nvfp4_linear, ongrid_weight, quantize_op, quantize_weight

__all__ = [
    "nvfp4_grouped_mm",
    "nvfp4_linear",
    "ongrid_weight",
    "quantize_op",
    "quantize_weight",
]
