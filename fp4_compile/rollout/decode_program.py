"""The rollout engine's decode step as one program: model step, sampling, log-prob, bookkeeping.

Shape legend: B rows of the batch bucket, V vocabulary, S_max cache slots.

One `DecodeProgram` per (engine, batch bucket, sampling settings), built once and kept by the
engine: its state lives in static buffers (the token to feed, its position, the kv length, a
device-side step counter n, the request keys, the EOS flags, and per-step output rows), and one
call generates one token for every row without reading anything on the host:

    logits = step(ids, positions, kv_len, cache)       # the compiled model step, Tq = 1
    picked, logp = pick_tokens(logits, keys, n, ...)   # the same function as the prefill token
    tokens[:, n], logps[:, n] = picked, logp; finished |= picked == eos
    ids, positions, kv_len, n = picked, positions + 1, kv_len + 1, n + 1

On CUDA with capture=True the call is captured once as a CUDA graph (after one ordinary call that
compiles and warms the step) and every later call is one replay: the same kernels on the same
buffers, so the same bits, and one launch per token. Everything a replay reads has a fixed
address: the state buffers, the bucket's KV cache, the parameters and the weight store's
quantized bytes (`weight_store.py`: rewritten in place by `update_weights`, so a replay after an
update reads the new weights). Elsewhere (CPU, or capture=False) the same call runs eagerly.

The seeded noise of token n is `gumbel_noise(keys, n)` with n a device tensor: the same integers,
so the same bits as the host-side step number (`sampling.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_cache import StaticKVCache
from .logprobs import token_logprobs
from .sampling import filter_logits, gumbel_noise, sample


@dataclass(frozen=True)
class Sampling:
    """temperature 0 = greedy (argmax, ties to the lower id; log-probs of the unscaled logits)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0


def pick_tokens(last_BV, keys_B, n, sampling: Sampling, vocab_size: int):
    """(token int64 [B], its FP32 log-prob [B]) of draw number n (int or int64 [] tensor)."""
    if sampling.temperature == 0:
        picked = torch.argmax(last_BV.float(), dim=-1)  # the first maximum: lower id wins
        return picked, token_logprobs(last_BV, picked, 1.0)
    scaled = last_BV.float() / sampling.temperature
    filtered = filter_logits(scaled, top_k=sampling.top_k, top_p=sampling.top_p)
    picked = sample(filtered, gumbel_noise(keys_B, n, vocab_size))
    return picked, token_logprobs(last_BV, picked, sampling.temperature)


class DecodeProgram:
    """One decode token for `batch` rows; `step(ids_B1, positions_B1, kv_len_B, cache)` is the
    engine's compiled model step; `max_tokens`: the most tokens one generate call records."""

    def __init__(self, step, cache: StaticKVCache, *, batch: int, sampling: Sampling,
                 vocab_size: int, max_tokens: int, capture: bool):  # fmt: skip
        device = cache.keys[0].device
        self.step, self.cache, self.batch = step, cache, batch
        self.sampling, self.vocab_size = sampling, vocab_size

        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.ids, self.positions, self.kv_len = zeros(batch, 1), zeros(batch, 1), zeros(batch)
        self.n, self.keys, self.eos = zeros(), zeros(batch), zeros()
        self.finished = zeros(batch, dtype=torch.bool)
        self.tokens = zeros(batch, max_tokens)
        self.logps = zeros(batch, max_tokens, dtype=torch.float32)
        self.graph = None
        if capture:
            self._capture()

    def _one_token(self) -> None:
        logits = self.step(self.ids, self.positions, self.kv_len, self.cache)
        picked, logp = pick_tokens(logits[:, 0], self.keys, self.n, self.sampling,
                                   self.vocab_size)  # fmt: skip
        self.record(picked, logp)
        self.ids.copy_(picked[:, None])
        self.positions.add_(1)
        self.kv_len.add_(1)

    def record(self, picked_B: torch.Tensor, logp_B: torch.Tensor) -> None:
        """Write token n's picks and log-probs, raise the EOS flags, advance n (device only)."""
        index = self.n.view(1)
        self.tokens.index_copy_(1, index, picked_B[:, None])
        self.logps.index_copy_(1, index, logp_B[:, None])
        self.finished |= picked_B == self.eos
        self.n.add_(1)

    def _capture(self) -> None:
        """One ordinary call (compiles the Tq = 1 step, warms its kernels; the state it leaves is
        overwritten by `start`), then the capture."""
        device = self.ids.device
        self.kv_len.fill_(1)
        self._one_token()
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self._one_token()
        except Exception as e:
            raise RuntimeError(
                "capturing the decode program as a CUDA graph failed (an op of the step or of "
                f"sampling syncs with the host); run with cuda_graphs=False: {e}"
            ) from e
        self.graph = graph

    def start(self, first_B, first_logp_B, positions_B, keys_B, eos: int | None) -> None:
        """A new generate call: token 0 (sampled from the prefill's logits) recorded and fed
        next at `positions_B` (the prompt lengths)."""
        self.n.zero_()
        self.finished.zero_()
        self.eos.fill_(-1 if eos is None else eos)
        self.keys.copy_(keys_B)
        self.record(first_B, first_logp_B)
        self.ids.copy_(first_B[:, None])
        self.positions.copy_(positions_B[:, None])
        self.kv_len.copy_(positions_B + 1)

    def __call__(self) -> None:
        """Generate the next token of every row (a replay when captured)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._one_token()
