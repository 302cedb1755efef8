"""Verifiable tasks generated in-process (no downloads): a problem is a prompt string and its one
correct answer; the verifier scores a completion string.

- `addition`: "37+85=" -> "122", "07+05=" -> "012" (operands zero-padded to `num_digits`
  digits, the answer to `num_digits + 1`: every prompt and answer of a task has one length, so
  the compiled graphs see one shape).
- `sort`: "s:3142>" -> "1234" (`num_digits` random digits, sorted ascending).
- `mix`: alternates the two, so one policy learns both.
- `rg:<family>`: a reasoning-gym generator pinned to short problems (rl/tasks/reasoning_gym.py; the
  optional extra `minite[tasks]`).

Held-out split (rl/tasks/base.py): 1/8 of each task's prompts, chosen by a hash of the prompt
text, form the held-out set; training and warm-start draws skip them, so no held-out problem is
ever trained on.

Reward (`Task.reward`): 1.0 for the exact answer; otherwise `partial_credit` times the fraction
of answer positions that hold the right character (over max(len(answer), len(completion)), so
padding a completion with junk does not pay). `partial_credit=0` gives the plain 0/1 verifier.
Prompts are drawn from `random.Random(seed)`: the same seed gives the same problems anywhere.
"""

from __future__ import annotations

import random

from .base import Problem, Task, check_split_request
from .base import positional_accuracy as positional_accuracy  # re-exported
from .reasoning_gym import ReasoningGymTask


class AdditionTask(Task):
    name = "addition"

    def sample(self, rng: random.Random) -> Problem:
        hi = 10**self.num_digits - 1
        a, b = rng.randint(0, hi), rng.randint(0, hi)
        n = self.num_digits
        return Problem(prompt=f"{a:0{n}d}+{b:0{n}d}=", answer=f"{a + b:0{n + 1}d}", task=self.name)

    @property
    def max_prompt_chars(self) -> int:
        return 2 * self.num_digits + 2

    @property
    def max_answer_chars(self) -> int:
        return self.num_digits + 1


class SortTask(Task):
    name = "sort"

    def sample(self, rng: random.Random) -> Problem:
        digits = [rng.randint(0, 9) for _ in range(self.num_digits)]
        return Problem(
            prompt="s:" + "".join(map(str, digits)) + ">",
            answer="".join(map(str, sorted(digits))),
            task=self.name,
        )

    @property
    def max_prompt_chars(self) -> int:
        return self.num_digits + 3

    @property
    def max_answer_chars(self) -> int:
        return self.num_digits


class MixTask(Task):
    """Problem i comes from task i % len(tasks) (then each task draws from the shared rng)."""

    name = "mix"

    def __init__(self, tasks: list[Task]) -> None:
        if not tasks:
            raise ValueError("MixTask needs at least one task")
        self.tasks = list(tasks)
        self.alphabet = "".join(sorted(set("".join(t.alphabet for t in self.tasks))))

    def problems(self, num: int, *, seed: int, split: str = "train") -> list[Problem]:
        check_split_request(num, split)
        rng = random.Random(seed)
        return [self.tasks[i % len(self.tasks)].sample_split(rng, split) for i in range(num)]

    def sample(self, rng: random.Random) -> Problem:
        raise TypeError("MixTask draws through problems(num, seed=...), not sample()")

    def sample_split(self, rng: random.Random, split: str) -> Problem:
        raise TypeError("MixTask draws through problems(num, seed=...), not sample_split()")

    def reward(self, problem: Problem, completion: str) -> float:
        for task in self.tasks:
            if task.name == problem.task:
                return task.reward(problem, completion)
        raise ValueError(f"problem of task {problem.task!r} is not part of this mix")

    @property
    def max_prompt_chars(self) -> int:
        return max(t.max_prompt_chars for t in self.tasks)

    @property
    def max_answer_chars(self) -> int:
        return max(t.max_answer_chars for t in self.tasks)


RG_TASK_NAMES = (
    "rg:chain_sum",
    "rg:spell_backward",
    "rg:count_bits",
)  # rl/tasks/reasoning_gym.py RG_FAMILIES
TASK_NAMES = ("addition", "sort", "mix") + RG_TASK_NAMES


def make_task(name: str, *, num_digits: int, partial_credit: float = 0.0) -> Task:
    """A task by name (`num_digits` sizes the built-in ones; the rg: families pin their own)."""
    if name in RG_TASK_NAMES:
        return ReasoningGymTask(name, partial_credit=partial_credit)
    if name == "addition":
        return AdditionTask(num_digits=num_digits, partial_credit=partial_credit)
    if name == "sort":
        return SortTask(num_digits=num_digits, partial_credit=partial_credit)
    if name == "mix":
        return MixTask(
            [
                AdditionTask(num_digits=num_digits, partial_credit=partial_credit),
                SortTask(num_digits=num_digits, partial_credit=partial_credit),
            ]
        )
    raise ValueError(f"task must be one of {TASK_NAMES}, got {name!r}")
