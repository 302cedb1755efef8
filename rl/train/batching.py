"""The learner's batch: rollout sequences (prompt + generated tokens, each ending at its own EOS
or at the response budget) packed right-padded into ids [N, W'] with the target mask and the
rollout log-probs, where W' is the longest REAL sequence of the batch rounded up to a width
bucket, never the full width W = longest prompt + max_new_tokens.

Shape legend: N sequences, W the full width (the most a sequence can hold), W' the batch's
learner width (<= W), T' = W' - 1 target positions.

The widths (`width_buckets`, `learner_width`) live in the core, `fp4_compile/learner_widths.py`
(the TRL integration uses them too; re-exported here). A batch whose sequences all stop early
(EOS) runs at the smallest bucket that holds its longest sequence; the tokens past a sequence's
own end are padding inside W' (masked out of the loss, their log-probs never read). Under the
strict recipe each row's log-probs do not depend on the batch's width (attention is causal and
walks the keys in fixed blocks from position 0; every other op is per token), so the learner
still equals the rollout bit for bit; the tests check it.
"""

from __future__ import annotations

import torch

from ...learner_widths import BUCKET_MULTIPLE, NUM_BUCKETS, learner_width, width_buckets

__all__ = [
    "BUCKET_MULTIPLE",
    "NUM_BUCKETS",
    "learner_width",
    "pack_batch",
    "width_buckets",
]


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
