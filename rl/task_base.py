"""What every task is: a `Problem` (prompt, its one correct answer, the task's name) and a `Task`
that draws problems from a seed and scores completions (rl/tasks.py: the built-in tasks and
`make_task`; rl/rg_tasks.py: the reasoning-gym families)."""

from __future__ import annotations

import random
from dataclasses import dataclass


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

    def sample(self, rng: random.Random) -> Problem:
        raise NotImplementedError

    def reward(self, problem: Problem, completion: str) -> float:
        if completion == problem.answer:
            return 1.0
        return self.partial_credit * positional_accuracy(completion, problem.answer)

    def problems(self, num: int, *, seed: int, split: str = "train") -> list[Problem]:
        """`num` problems drawn from `random.Random(seed)` (reproducible). `split` ("train" or
        "eval", the held-out set): the built-in tasks draw both alike (their streams predate
        the split; only the seed keeps the held-out set apart), the rg: tasks reserve part of
        their problem space for "eval"."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if num < 1:
            raise ValueError(f"num must be >= 1, got {num}")
        rng = random.Random(seed)
        return [self.sample(rng) for _ in range(num)]

    @property
    def max_prompt_chars(self) -> int:
        raise NotImplementedError

    @property
    def max_answer_chars(self) -> int:
        raise NotImplementedError
