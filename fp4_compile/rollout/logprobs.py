"""The ONE log-prob function of learner and rollout, and the learner's sequence log-probs."""

from __future__ import annotations

import torch

from ..codegen import logprobs as shared_logprobs
from ..dynamo_guard import no_silent_eager_fallback
from .learner_head import (
    DEFAULT_CHUNK_ROWS,
    chunked_head_parts,
    head_token_logprobs,
    learner_hidden,
)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """FP32 log-softmax(logits / temperature) gathered at `tokens`, per row, through the shared
    batch-invariant `fp4_compile` op. logits [..., V], tokens [...] -> FP32 [...]."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    flat = logits.reshape(-1, logits.shape[-1])
    logp, _entropy = shared_logprobs(flat, tokens.reshape(-1), temperature)
    return logp.reshape(tokens.shape)


def pad_right(
    sequences: list[list[int]], pad_id: int = 0, device="cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("sequences must be a non-empty list of non-empty token lists")
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    ids = torch.full((len(sequences), int(lengths.max())), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return ids.to(device), lengths


def sequence_logprobs(
    model,
    sequences: list[list[int]],
    prompt_lens: list[int],
    *,
    temperature: float = 1.0,
    device=None,
    chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
) -> list[torch.Tensor]:
    """The learner's view: ONE forward over whole (right-padded, causal, unmasked) sequences;
    returns per sequence the FP32 log-probs of its generated tokens (positions >= prompt_len).

    A minite-compiled model runs its head only on the rows read (the generated tokens'
    predecessors), `chunk_rows` rows at a time, never materializing [tokens x vocabulary] logits
    (`learner_head.py`; bitwise the same log-probs at every chunk size). chunk_rows=None, or a
    model compiled otherwise, computes the model's full logits."""
    if len(prompt_lens) != len(sequences):
        raise ValueError(
            f"prompt_lens has {len(prompt_lens)} entries for {len(sequences)} sequences"
        )
    for i, (s, p) in enumerate(zip(sequences, prompt_lens)):
        if not 1 <= p < len(s):
            raise ValueError(f"prompt_lens[{i}]={p} must be in [1, len(sequences[{i}])={len(s)})")
    if device is None:
        device = next(iter(_parameters(model))).device
    ids, lengths = pad_right(sequences, device=device)
    parts = chunked_head_parts(model) if chunk_rows is not None else None
    if parts is not None:
        decoder, head_weight = parts
        hidden = learner_hidden(decoder, ids, chunk_rows=chunk_rows)
        width = ids.shape[1]
        rows = torch.cat(
            [
                torch.arange(i * width + p - 1, i * width + n - 1)
                for i, (p, n) in enumerate(zip(prompt_lens, lengths.tolist()))
            ]
        ).to(ids.device)
        targets = ids.reshape(-1)[rows + 1]
        logp = head_token_logprobs(
            hidden.reshape(-1, hidden.shape[-1])[rows],
            head_weight,
            targets,
            temperature,
            chunk_rows,
        )
        return list(logp.split([n - p for p, n in zip(prompt_lens, lengths.tolist())]))
    with no_silent_eager_fallback():
        logits = model(input_ids=ids, use_cache=False).logits
    out = []
    for i, (p, n) in enumerate(zip(prompt_lens, lengths.tolist())):
        out.append(token_logprobs(logits[i, p - 1 : n - 1], ids[i, p:n], temperature))
    return out


def _parameters(model):
    inner = getattr(model, "_orig_mod", model)
    return inner.parameters()
