"""Held-out evaluation: a fixed set of problems per run, decoded greedily by the rollout engine.

How held-out is defined: the set is `task.problems(eval_size, seed=derive_seed(seed, "eval"),
split="eval")`. Its content is disjoint from everything the run trains on: every task (built-in
and rg:) reserves the prompts whose sha256 falls into bucket 0 of 8 (`task_base.split_of`, 1/8
of the problem space) for the "eval" split, and the warm start and the GRPO prompts draw only
from the "train" split. The set is fixed by the run's seed, drawn from a seed stream of its own
(no training prompt ("prompts", step) or warm-start batch ("warm", step) uses it), with
replacement: in a small space a held-out problem can occur twice. Greedy decoding
(`temperature=0`: argmax, no sampling) makes the score a function of the weights alone.

The evaluation leaves the run's state as it found it: the global RNG streams and the
stochastic-rounding counters are saved and restored around it, so a run's training records are
the same bits with evaluation on or off.

    eval/accuracy  share of held-out problems whose greedy answer (`task.extract_answer` of the
                   completion) is exactly the reference answer
    eval/reward    mean task reward of those answers (partial credit included)
"""

from __future__ import annotations

from ...seeds import derive_seed
from ...sr_stream import set_sr_state, sr_state
from ..tasks.builtin import Problem, Task
from ..tasks.tokenizer import Tokenizer
from .checkpoint import rng_state, set_rng_state


def heldout_problems(task: Task, *, seed: int, size: int) -> list[Problem]:
    return task.problems(size, seed=derive_seed(seed, "eval"), split="eval")


def evaluate(
    engine,
    task: Task,
    tok: Tokenizer,
    problems: list[Problem],
    *,
    max_prompt_tokens: int,
    max_new_tokens: int,
) -> dict[str, float]:
    """Greedy answers to `problems`: ONE generate over all of them, filled up to a multiple of
    `engine.max_batch` rows with copies of the last batch's first prompt (whose answers are
    dropped), so every batch the engine runs has the size it runs in training (the embedded
    engine's bucket; the stock engine's static waves)."""
    encoded = [tok.encode_prompt(p.prompt) for p in problems]
    for p, ids in zip(problems, encoded):
        if len(ids) > max_prompt_tokens:  # never truncated: the width is fixed
            raise ValueError(
                f"held-out prompt {p.prompt!r} encodes to {len(ids)} tokens, more than the "
                f"{max_prompt_tokens} measured by token_budget"
            )
    real = len(encoded)
    last_batch = (real - 1) // engine.max_batch * engine.max_batch
    filled = encoded + [encoded[last_batch]] * (-real % engine.max_batch)
    saved_rng, saved_sr = rng_state(), sr_state()
    try:
        out = engine.generate(
            filled, max_new_tokens=max_new_tokens, temperature=0.0, eos_token_id=tok.eos_id
        )
    finally:
        set_rng_state(saved_rng)
        set_sr_state(saved_sr)
    completions = [tok.decode(t) for t in out.tokens[:real]]
    exact = [float(task.extract_answer(c) == p.answer) for p, c in zip(problems, completions)]
    rewards = [task.reward(p, c) for p, c in zip(problems, completions)]
    return {
        "eval/accuracy": sum(exact) / len(exact),
        "eval/reward": sum(rewards) / len(rewards),
    }
