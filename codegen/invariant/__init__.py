"""Batch-invariant ops that are not NVFP4 GEMMs: linear/mm, RMSNorm, attention, log-probs, routing, SwiGLU, GQA repeat, embedding, row gathers and fixed-order sums.

`api.py` the validated public functions, `ops.py` the registrations, `reference.py` the CPU reference,
`*_kernel(s).py` the Triton kernels. May import the core, `..runtime`, `..configs`, `..triton_helpers`.
"""

from . import embedding, gather_rows, ops, ordered_sum, repeat_kv, silu_mul  # noqa: F401  (register the ops)
from .api import attention, linear, logprobs, mm, rms_norm, route, sort_by_expert

__all__ = ["attention", "linear", "logprobs", "mm", "rms_norm", "route", "sort_by_expert"]
