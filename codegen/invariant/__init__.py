"""Batch-invariant ops besides the NVFP4 GEMMs: linear, RMSNorm, attention, logprobs, routing, ...
Layout: api.py (public functions), ops.py (registrations), reference.py (CPU), *_kernel(s).py.
May import the core, ..runtime, ..configs and ..triton_helpers; never ..nvfp4 or ..moe.
"""

from . import embedding, gather_rows, ops, ordered_sum, repeat_kv, silu_mul  # noqa: F401
from .api import attention, linear, logprobs, mm, rms_norm, route, sort_by_expert

__all__ = ["attention", "linear", "logprobs", "mm", "rms_norm", "route", "sort_by_expert"]
