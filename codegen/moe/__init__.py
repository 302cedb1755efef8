"""MoE glue around the experts' GEMMs: the top-k combine, the routing-weight row scale, the BF16 grouped GEMM.

`<op>.py` an op's registration, reference and dispatch; `<op>_kernel.py` its Triton kernel.
May import the core, `..invariant` and `..nvfp4`.
"""

from . import combine, grouped_mm, row_scale  # noqa: F401  (register the ops)
