"""The rollout-engine seam: what the GRPO trainer, the held-out evaluation and the TRL integration
call on a rollout engine, whichever engine it is, and the one check of `generate`'s arguments
every engine runs first.

Three engines implement `RolloutEngineProtocol`: the embedded `fp4_compile.rollout.RolloutEngine`
(continuous batching, learner == rollout bitwise), `fp4_compile.vllm_plugin.VLLMRolloutEngine`
(vLLM with minite's plugin) and the alignment ablation's `StockRolloutEngine`
(`rl/train/stock_rollout.py`). The trainer picks one by name from `rl/train/engines.py`'s table.

Every engine's `generate` takes ANY number of token-id prompts (the whole rollout batch: prompts x
group size) and returns one `RolloutOutput`; `max_batch` is how many requests it runs at once,
never a limit on a call. A caller never splits a batch into chunks of `max_batch`.

A core module: it imports nothing of the package, so the learner, the engines and the TRL
integration all import it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


@dataclass
class RolloutOutput:
    tokens: list[list[int]]
    """Generated token ids per request (prompt excluded)."""
    logprobs: list[torch.Tensor]
    """FP32 [len(tokens[i])] log-probs of the sampled tokens under logits / temperature."""
    finish_reasons: list[str] = field(default_factory=list)
    """"eos" or "length" per request."""


@runtime_checkable
class RolloutEngineProtocol(Protocol):
    """What callers use of a rollout engine: `generate` over a whole batch, `update_weights`
    after every optimizer step, and the two sizes it was built for."""

    max_batch: int
    """Requests the engine runs at once (its KV cache rows); a call may hold any number."""
    max_seq_len: int
    """The most tokens a request holds: its prompt plus its max_new_tokens."""

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int | list[int],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | list[int] = 0,
        eos_token_id: int | None = None,
    ) -> RolloutOutput: ...

    def update_weights(self, model: torch.nn.Module) -> None: ...


@dataclass(frozen=True)
class GenerateArgs:
    """`generate`'s arguments, checked and spelled out per request."""

    budgets: list[int]
    """max_new_tokens of each request (>= 1)."""
    seeds: list[int]
    """The seed of each request (non-negative ints; one int `seed` gives request i seed + i)."""
    greedy: bool
    """temperature == 0: argmax decoding."""


def check_generate_args(
    prompts,
    *,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    seed,
    vocab_size: int,
    max_seq_len: int,
    no_filter_reason: str | None = None,
) -> GenerateArgs:
    """Refuse a bad `generate` call before any work, naming the argument (and the request) that
    is wrong; return the per-request budgets and seeds. `no_filter_reason`: the engine applies no
    top-k / top-p filter, and this says why (then top_k != 0 or top_p != 1 is refused)."""
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list of token-id lists, got {prompts!r}")
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)) or len(p) == 0:
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids, got {p!r}")
    num = len(prompts)
    budgets = _budgets(max_new_tokens, num)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got {temperature!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    check_filter(top_k, top_p)
    if no_filter_reason is not None and (top_k != 0 or top_p != 1.0):
        raise ValueError(f"top_k={top_k}, top_p={top_p}: no filter here ({no_filter_reason})")
    seeds = _seeds(seed, num)
    for i, p in enumerate(prompts):  # an id outside the vocabulary would index out of bounds
        if min(p) < 0 or max(p) >= vocab_size:
            j = next(j for j, t in enumerate(p) if not 0 <= t < vocab_size)
            raise ValueError(
                f"prompts[{i}][{j}] = {int(p[j])} is not a token id in [0, vocab_size={vocab_size})"
            )
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        if len(p) + b > max_seq_len:
            raise ValueError(
                f"prompt {i} ({len(p)} tokens) + max_new_tokens ({b}) exceeds "
                f"max_seq_len={max_seq_len}"
            )
    return GenerateArgs(budgets=budgets, seeds=seeds, greedy=temperature == 0)


def check_filter(top_k: int, top_p: float) -> None:
    """top_k >= 0 (0: off) and 0 < top_p <= 1 (1: off)."""
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_k must be >= 0 and 0 < top_p <= 1, got top_k={top_k}, top_p={top_p}")


def _budgets(max_new_tokens, num: int) -> list[int]:
    """One max_new_tokens per request (>= 1) from an int or a list of num ints."""
    if isinstance(max_new_tokens, int):
        budgets = [max_new_tokens] * num
    else:
        budgets = list(max_new_tokens)
        if len(budgets) != num:
            raise ValueError(f"max_new_tokens list has {len(budgets)} entries for {num} prompts")
    for i, b in enumerate(budgets):
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            what = "max_new_tokens" if isinstance(max_new_tokens, int) else f"max_new_tokens[{i}]"
            raise ValueError(f"{what} must be an int >= 1, got {b!r}")
    return budgets


def _seeds(seed, num: int) -> list[int]:
    """One non-negative int seed per request from an int (request i: seed + i) or a list."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        seeds = [seed + i for i in range(num)]
    else:
        seeds = list(seed)
        if len(seeds) != num:
            raise ValueError(f"seed list has {len(seeds)} entries for {num} prompts")
    for i, s in enumerate(seeds):
        try:
            seeds[i] = operator.index(s)
        except TypeError:
            raise TypeError(f"seed[{i}] must be an int, got {type(s).__name__}") from None
        if seeds[i] < 0:
            raise ValueError(f"seed[{i}] must be non-negative, got {s}")
    return seeds
