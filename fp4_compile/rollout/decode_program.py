"""The rollout engine's decode step as one program: model step, sampling, log-prob, bookkeeping.

Shape legend: B rows (slots) of the batch bucket, V vocabulary, S_max cache slots, K rows admitted.

One `DecodeProgram` per (engine, batch bucket, sampling settings), built once and kept by the
engine: its state lives in static buffers, one entry per row (the token to feed, its position,
the kv length, the request key, the draw counter n = how many tokens the row's request has, its
token budget, the finished flag; the EOS id; per-row output rows), and one call generates one
token for every running row without reading anything on the host:

    live = ~finished
    logits = step(ids, positions, kv_len, cache)       # the compiled model step, Tq = 1
    picked, logp = pick_tokens(logits, keys, n, ...)   # per-row n: each row its request's draw
    tokens[r, n[r]], logps[r, n[r]] = picked, logp     # (a finished row writes past its end)
    n += live; finished |= live & (picked == eos | n == budget)
    ids, positions, kv_len = picked, positions + 1, kv_len + 1   # running rows only

Around the compiled step a token costs, on CUDA: the pick (`fp4_compile::sample_argmax`: scale,
the seeded Gumbel noise made in registers and first maximum in one launch); the shared log-prob
op; the bookkeeping of the last three lines
(`fp4_compile::decode_advance`, one launch). Each fused op is bitwise the torch ops it replaced
(`codegen/invariant/decode_reference.py`).

A finished row is frozen (it recomputes its last step in place, in bounds; rows never interact, so
it changes no other row's bits) until the engine admits a new request into it (`admit`: in-place
copies into the row's entries, its prefill written into its cache rows beforehand). So the rows of
one program run different requests at different token indices (continuous batching), and a
request's token t always draws the noise of (its key, t), whatever row or step it runs in.

On CUDA with capture=True the call is captured once as a CUDA graph (after one ordinary call that
compiles and warms the step) and every later call is one replay: the same kernels on the same
buffers, so the same bits, and one launch per token. Everything a replay reads has a fixed
address: the state buffers (changed only in place), the bucket's KV cache, the parameters and the
weight store's quantized bytes (`weight_store.py`: rewritten in place by `update_weights`, so a
replay after an update reads the new weights). Elsewhere (CPU, or capture=False) the same call
runs eagerly.

The seeded noise of token n is `gumbel_noise(keys, n)` with n a device tensor [B] (made inside
the pick): the same integers, so the same bits as the host-side step number (`sampling.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..codegen.invariant.decode_advance import decode_advance
from ..codegen.invariant.sample_argmax import sample_argmax
from .kv_cache import StaticKVCache
from .logprobs import token_logprobs
from .sampling import check_draw, filter_logits


@dataclass(frozen=True)
class Sampling:
    """temperature 0 = greedy (argmax, ties to the lower id; log-probs of the unscaled logits)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0


def pick_tokens(last_BV, keys_B, n, sampling: Sampling, vocab_size: int):
    """(token int64 [B], its FP32 log-prob [B]) of draw number n (int, int64 [] or [B] tensor):
    argmax(last.float() / T + gumbel_noise(keys, n)) (`sampling.sample`), greedy argmax(last).
    The pick makes the noise itself (`fp4_compile::sample_argmax`: no noise tensor)."""
    if sampling.temperature == 0:
        picked = sample_argmax(last_BV, None, None, 1.0)  # the first maximum: lower id wins
        return picked, token_logprobs(last_BV, picked, 1.0)
    check_draw(keys_B, n, vocab_size)
    if not isinstance(n, torch.Tensor):  # a host draw number (the prefill's): one device int64
        n = torch.tensor(n, dtype=torch.int64).to(keys_B.device)
    if sampling.top_k > 0 or sampling.top_p < 1.0:
        scaled = last_BV.float() / sampling.temperature
        filtered = filter_logits(scaled, top_k=sampling.top_k, top_p=sampling.top_p)
        picked = sample_argmax(filtered, keys_B, n, 1.0)  # x / 1 = x: the same keys
    else:
        picked = sample_argmax(last_BV, keys_B, n, sampling.temperature)
    return picked, token_logprobs(last_BV, picked, sampling.temperature)


class DecodeProgram:
    """One decode token for `batch` rows; `step(ids_B1, positions_B1, kv_len_B, cache)` is the
    engine's compiled model step; `max_tokens`: the most tokens one request records (each row's
    budget is below it)."""

    def __init__(
        self,
        step,
        cache: StaticKVCache,
        *,
        batch: int,
        sampling: Sampling,
        vocab_size: int,
        max_tokens: int,
        capture: bool,
    ):
        device = cache.keys[0].device
        self.step, self.cache, self.batch = step, cache, batch
        self.sampling, self.vocab_size, self.max_tokens = sampling, vocab_size, max_tokens

        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        # an idle row feeds token 0 at position 0 (kv_len 1: its step reads in bounds)
        self.ids, self.positions, self.kv_len = zeros(batch, 1), zeros(batch, 1), zeros(batch) + 1
        self.n, self.keys, self.budget, self.eos = zeros(batch), zeros(batch), zeros(batch), zeros()
        self.finished = zeros(batch, dtype=torch.bool)
        self.tokens = zeros(batch, max_tokens)
        self.logps = zeros(batch, max_tokens, dtype=torch.float32)
        self.graph = None
        if capture:
            self._capture()

    def _one_token(self) -> None:
        logits = self.step(self.ids, self.positions, self.kv_len, self.cache)
        picked, logp = pick_tokens(logits[:, 0], self.keys, self.n, self.sampling, self.vocab_size)
        self.record(picked, logp)

    def record(self, picked_B: torch.Tensor, logp_B: torch.Tensor) -> None:
        """Write each running row's token n (its picks and log-probs), advance its n, raise its
        finished flag at EOS or at its budget, and feed each row still running its pick at the
        next position (a row that just finished keeps its last step, in bounds): one
        `decode_advance` (device only). A finished row writes at its n, past its last token
        (below max_tokens: its budget is), and changes nothing else."""
        decode_advance(
            picked_B,
            logp_B,
            self.eos,
            self.budget,
            self.tokens,
            self.logps,
            self.n,
            self.finished,
            self.ids,
            self.positions,
            self.kv_len,
        )

    def _capture(self) -> None:
        """One ordinary call (compiles the Tq = 1 step, warms its kernels; the state it leaves is
        overwritten by `start`), then the capture."""
        device = self.ids.device
        self.kv_len.fill_(1)
        self.budget.fill_(self.max_tokens)
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

    def start(self, eos: int | None) -> None:
        """A new generate call: every row finished (idle) until `admit` fills it."""
        self.eos.fill_(-1 if eos is None else eos)
        self.finished.fill_(True)
        self.n.zero_()

    def admit(self, rows_K, first_K, first_logp_K, lengths_K, keys_K, budgets_K) -> None:
        """Rows `rows_K` (int64 [K] on the device) start new requests whose prompts (of
        `lengths_K` tokens) are already in their cache rows: token 0 (sampled from the prefill's
        logits with draw number 0) recorded and fed next at position lengths_K; budgets_K: each
        request's max_new_tokens (>= 1; a budget of 1 finishes at once). In-place copies only."""
        self.keys.index_copy_(0, rows_K, keys_K)
        self.budget.index_copy_(0, rows_K, budgets_K)
        self.n.index_fill_(0, rows_K, 1)
        self.tokens[:, 0].index_copy_(0, rows_K, first_K)
        self.logps[:, 0].index_copy_(0, rows_K, first_logp_K)
        done = (first_K == self.eos) | (budgets_K <= 1)
        self.finished.index_copy_(0, rows_K, done)
        self.ids[:, 0].index_copy_(0, rows_K, first_K)
        self.positions[:, 0].index_copy_(0, rows_K, lengths_K)
        self.kv_len.index_copy_(0, rows_K, lengths_K + 1)

    def __call__(self) -> None:
        """Generate the next token of every running row (a replay when captured)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._one_token()
