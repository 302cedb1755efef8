"""NVFP4: quantize (activations, weights, gradients) and the W4A4 GEMMs (dense, grouped, wgrad).
Layout: api.py, ops.py (registrations), op_args.py (positions), gemm.py (math), *_kernel.py.
May import the core, ..runtime, ..configs, ..triton_helpers and ..invariant; never ..moe.
"""

from . import ops  # noqa: F401  (register the ops)
from .api import nvfp4_grouped_linear, nvfp4_linear, ongrid_weight, quantize_op, quantize_weight

__all__ = [
    "nvfp4_grouped_linear",
    "nvfp4_linear",
    "ongrid_weight",
    "quantize_op",
    "quantize_weight",
]
