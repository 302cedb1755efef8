"""Batch-invariant ops besides the NVFP4 GEMMs: linear, RMSNorm, attention, logprobs, routing, ...
Layout: api.py (public functions), <op>.py (registration), reference.py (CPU), <op>_kernel.py.
May import the core, ..runtime, ..configs and ..triton_helpers; never ..nvfp4 or ..moe.
"""

from . import (  # noqa: F401  (register the ops)
    attention,
    attention_mask_args,
    decode_advance,
    embedding,
    gather_rows,
    kv_cache_write,
    kv_pages,
    linear,
    logprobs,
    ordered_sum,
    position_mask,
    rms_norm,
    rms_norm_rotary,
    rotary_tables,
    routing,
    sample_argmax,
    silu_mul,
    trig,
)
