"""What every task is: a `Problem` (prompt, its one correct answer, the task's name) and a `Task`
that draws problems from a seed and scores completions (rl/tasks/builtin.py: the built-in tasks and
`make_task`; rl/tasks/reasoning_gym.py: the reasoning-gym families).

Splits: every task's problem space is cut in two by the prompt text. A prompt whose sha256 falls
into bucket 0 of `EVAL_BUCKETS` belongs to the held-out split ("eval"), every other prompt to
"train" (`split_of`). `problems(num, seed=s, split=...)` draws from the seeded stream and keeps
only the problems of the split asked for, so the training stream (GRPO prompts, warm-start
batches) never holds a held-out problem, however small the problem space.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

EVAL_BUCKETS = 8
"""1/8 of each task's prompts are held out."""
SPLITS = ("train", "eval")
MAX_DRAWS_PER_PROBLEM = 64 * EVAL_BUCKETS
"""Draws `problems` may spend per problem asked for before it concludes that the split is
(nearly) empty, an error rather than an endless loop."""


def split_of(prompt: str) -> str:
    """ "eval" for the prompts reserved for the held-out set, else "train"."""
    bucket = hashlib.sha256(prompt.encode()).digest()[0] % EVAL_BUCKETS
    return "eval" if bucket == 0 else "train"


def check_split_request(num: int, split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise ValueError(f"num must be an int >= 1, got {num!r}")


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    task: str


def positional_accuracy(completion: str, answer: str) -> float:
    width = max(len(completion), len(answer))
    if width == 0:
        return 1.0
    return sum(a == b for a, b in zip(completion, answer)) / width


class Task:
    name = "task"
    alphabet = ""
    """Characters the task's prompts and answers may hold (a superset is fine); the character
    tokenizer appends those its built-in `CHARACTERS` lack. "" for the built-in tasks, whose
    vocabulary is the built-in one."""

    def __init__(self, *, num_digits: int, partial_credit: float = 0.0) -> None:
        if not isinstance(num_digits, int) or isinstance(num_digits, bool) or num_digits < 1:
            raise ValueError(f"num_digits must be a positive int, got {num_digits!r}")
        if not 0.0 <= partial_credit < 1.0:
            raise ValueError(f"partial_credit must be in [0, 1), got {partial_credit!r}")
        self.num_digits = num_digits
        self.partial_credit = float(partial_credit)

    system_prompt = ""
    """The system turn a chat template renders before this task's prompts by default
    (`TrainConfig.system_prompt=None`); "" = none. The built-in tasks have none: their compact
    prompts ("s:3142>") are answered at once."""

    def sample(self, rng: random.Random) -> Problem:
        raise NotImplementedError

    def extract_answer(self, completion: str) -> str:
        """The part of a completion the verifier scores: the built-in tasks score the whole
        completion (the reasoning-gym families extract it, rl/tasks/reasoning_gym.py)."""
        return completion

    def reward(self, problem: Problem, completion: str) -> float:
        if completion == problem.answer:
            return 1.0
        return self.partial_credit * positional_accuracy(completion, problem.answer)

    def problems(self, num: int, *, seed: int, split: str = "train") -> list[Problem]:
        """The first `num` problems of `split` ("train" or "eval", the held-out set) among those
        `sample` draws from `random.Random(seed)`: the same seed gives the same problems
        anywhere, and no "train" problem is ever an "eval" one (`split_of`)."""
        check_split_request(num, split)
        rng = random.Random(seed)
        return [self.sample_split(rng, split) for _ in range(num)]

    def sample_split(self, rng: random.Random, split: str) -> Problem:
        """The next problem of `split` that `sample(rng)` draws (the others are skipped)."""
        for _ in range(MAX_DRAWS_PER_PROBLEM):
            problem = self.sample(rng)
            if split_of(problem.prompt) == split:
                return problem
        raise ValueError(
            f"{self.name}: no {split!r} problem in {MAX_DRAWS_PER_PROBLEM} draws; the task's "
            f"problem space (num_digits={self.num_digits}) is too small to split"
        )

    @property
    def max_prompt_chars(self) -> int:
        raise NotImplementedError

    @property
    def max_answer_chars(self) -> int:
        raise NotImplementedError
