"""NVFP4: quantize (activations, weights, gradients), the W4A4 GEMMs (dense, grouped MoE, wgrad), their ops.

`api.py` the public functions, `ops.py` the registrations, `op_args.py` the ops' argument positions, `gemm.py` the
forward/backward math (CPU reference, CUDA launches), `*_kernel.py` the Triton kernels. May import the core and `..invariant`.
"""

from . import ops  # noqa: F401  (register the ops)
from .api import nvfp4_grouped_linear, nvfp4_linear, ongrid_weight, quantize_op, quantize_weight

__all__ = ["nvfp4_grouped_linear", "nvfp4_linear", "ongrid_weight", "quantize_op", "quantize_weight"]
