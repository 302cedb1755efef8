"""The learner's batch: rollout sequences (prompt + generated tokens, each ending at its own EOS
or at the response budget) packed right-padded into ids [N, W'] with the target mask and the
rollout log-probs, where W' is the longest REAL sequence of the batch rounded up to a width
bucket, never the full width W = longest prompt + max_new_tokens.

Shape legend: N sequences, W the full width (the most a sequence can hold), W' the batch's
learner width (<= W), T' = W' - 1 target positions.

Why buckets: the learner is compiled for static shapes (one graph per width), so the widths a run
can meet are few and fixed in advance: `width_buckets(W)` holds at most `NUM_BUCKETS` widths,
multiples of `BUCKET_MULTIPLE` below W, and W itself. A batch whose sequences all stop early
(EOS) runs at the smallest bucket that holds its longest sequence; the tokens past a sequence's
own end are padding inside W' (masked out of the loss, their log-probs never read). Under the
strict recipe each row's log-probs do not depend on the batch's width (attention is causal and
walks the keys in fixed blocks from position 0; every other op is per token), so the learner
still equals the rollout bit for bit; the tests check it.
"""

from __future__ import annotations

import torch

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


def pack_batch(
    prompts: list[list[int]],
    tokens: list[list[int]],
    logprobs: list[torch.Tensor],
    *,
    pad_id: int,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> ids [N, width] (prompt, generated tokens up to and including the sequence's EOS, then
    `pad_id`), mask [N, width - 1] (1 where the target ids[:, t + 1] is a generated token) and
    the rollout log-probs [N, width - 1] aligned with the targets (0 elsewhere). `tokens[i]`
    holds sequence i's generated tokens only up to its end (the engine drops what a row decoded
    after its EOS), so nothing past a sequence's end is a target."""
    n = len(prompts)
    if not len(tokens) == len(logprobs) == n:
        raise ValueError(f"{n} prompts, {len(tokens)} completions, {len(logprobs)} log-prob rows")
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.float32)
    rollout_logp = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, (p, gen, lp) in enumerate(zip(prompts, tokens, logprobs)):
        seq = p + gen
        if len(seq) > width:
            raise ValueError(f"sequence {i} has {len(seq)} tokens, more than width={width}")
        if len(lp) != len(gen):
            raise ValueError(f"sequence {i}: {len(gen)} tokens but {len(lp)} log-probs")
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, len(p) - 1 : len(seq) - 1] = 1.0
        rollout_logp[i, len(p) - 1 : len(seq) - 1] = lp
    return ids, mask, rollout_logp
