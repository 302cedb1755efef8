"""NVFP4: quantize (activations, weights, gradients) and the W4A4 GEMMs (dense, grouped, wgrad).
Layout: api.py, <op>.py (quantize, linear, grouped_linear), *_kernel.py, gemm.py (shared math).
May import the core, ..runtime, ..configs, ..triton_helpers and ..invariant; never ..moe.
"""

from . import grouped_linear, linear, quantize, quantized_linear  # noqa: F401  (register the ops)
