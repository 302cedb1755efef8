"""The ONE log-prob function of learner and rollout, and the learner's sequence log-probs."""

from __future__ import annotations

import torch

from ..dynamo_guard import no_silent_eager_fallback


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """FP32 log-softmax(logits / temperature) gathered at `tokens`, per row, through the shared
    batch-invariant `fp4_compile` op. logits [..., V], tokens [...] -> FP32 [...]."""
    from ..codegen import logprobs as shared_logprobs

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
) -> list[torch.Tensor]:
    """The learner's view: ONE forward over whole (right-padded, causal, unmasked) sequences;
    returns per sequence the FP32 log-probs of its generated tokens (positions >= prompt_len)."""
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
    with no_silent_eager_fallback():
        logits = model(input_ids=ids, use_cache=False).logits
    out = []
    for i, (p, n) in enumerate(zip(prompt_lens, lengths.tolist())):
        out.append(token_logprobs(logits[i, p - 1 : n - 1], ids[i, p:n], temperature))
    return out


def _parameters(model):
    inner = getattr(model, "_orig_mod", model)
    return inner.parameters()
