"""MoE glue around the experts' GEMMs: the top-k combine, the routing weights' row scale, BF16 GEMM.
Layout: reference.py (the CPU references), <op>.py (registration, fake, autograd, dispatch),
<op>_kernel.py (Triton kernel and launcher).
May import the core, ..runtime, ..configs, ..triton_helpers, ..invariant and ..nvfp4.
"""

from . import (  # noqa: F401  (register the ops)
    combine,
    combine_add_rms_norm,
    combine_add_rms_norm_parts,
    expert_order,
    grouped_mm,
    routing_order,
    row_scale,
)
