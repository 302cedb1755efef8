"""The learner's batch widths, shared by the GRPO trainer (`rl/train/batching.py`) and the TRL
integration: a learner batch is right-padded to the smallest of a few fixed width buckets that
holds its longest real sequence, never to the full width W = longest prompt + max_new_tokens.

Why buckets: the learner is compiled for static shapes (one graph per width), so the widths a run
can meet are few and fixed in advance: `width_buckets(W)` holds at most `NUM_BUCKETS` widths,
multiples of `BUCKET_MULTIPLE` below W, and W itself. Under the strict recipe each row's log-probs
do not depend on the batch's width (attention is causal and walks the keys in fixed blocks from
position 0; every other op is per token), so the learner still equals the rollout bit for bit.
"""

from __future__ import annotations

NUM_BUCKETS = 8
"""At most this many learner widths per run (so at most this many learner compilations, within
Dynamo's recompile limit)."""
BUCKET_MULTIPLE = 16
"""Bucket widths below the full width are multiples of this (GEMM tiles want multiples of 16)."""


def width_buckets(full_width: int) -> tuple[int, ...]:
    """The widths the learner's batch may take for a full width W, ascending, W the last:
    ceil(W * i / NUM_BUCKETS) rounded up to BUCKET_MULTIPLE (capped at W), i = 1..NUM_BUCKETS.
    A W at most BUCKET_MULTIPLE has the one bucket W."""
    if not isinstance(full_width, int) or full_width < 2:
        raise ValueError(f"full_width must be an int >= 2, got {full_width!r}")
    widths = set()
    for i in range(1, NUM_BUCKETS + 1):
        w = -(-full_width * i // NUM_BUCKETS)
        widths.add(min(-(-w // BUCKET_MULTIPLE) * BUCKET_MULTIPLE, full_width))
    return tuple(sorted(widths))


def learner_width(longest: int, full_width: int) -> int:
    """The smallest bucket of `full_width` that holds a sequence of `longest` tokens."""
    if not 1 <= longest <= full_width:
        raise ValueError(f"longest={longest} must be in [1, full_width={full_width}]")
    return next(w for w in width_buckets(full_width) if w >= longest)
