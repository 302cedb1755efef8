"""Tasks from reasoning-gym's procedural generators (offline, seeded): `task=rg:<dataset>`.

Each family is pinned to a small configuration so that its questions and answers fit a tiny
character-level model, and declares, from that configuration (never from a sample), the two
things the trainer needs before the first step:

- `max_prompt_chars` / `max_answer_chars`: exact bounds, so the padded batch width is fixed (the
  learner compiles once); `problems()` checks every problem against them and raises rather than
  truncate.
- `alphabet`: every character a prompt or answer can hold; the character tokenizer appends the
  ones it lacks (`CharTokenizer(extra_characters=...)`), so the built-in tasks keep their
  vocabulary.

Families and their verifiers:

- `rg:chain_sum`: "State the final answer to the following arithmetic problem: 47 - 9 =" -> "38"
  (two terms of 1-2 digits). Verified with math-verify: the completion must parse as a number
  equal to the answer ("38.0" counts) and consist of nothing but that number ("38x" does not).
- `rg:spell_backward`: "Spell this word backward (example: sun -> nus): chess" -> "ssehc" (words
  of 3-5 letters). Verified with the dataset's own `score_answer` (1.0 exact, case-insensitive;
  otherwise credit per leading matching character).
- `rg:count_bits`: "How many 1 bits are there in the binary representation of the number 200?"
  -> "3" (numbers 1-999). Verified with math-verify, as chain_sum.

Answer extraction (`extract_answer`), so a model that reasons before answering is scored on its
answer, not on its reasoning: the verifier sees the content of the completion's LAST
`<answer>...</answer>` block (reasoning-gym's own `extract_answer`, stripped); without such a
block, the completion's last non-empty line, stripped (a model that answers at once: the whole
completion). What the verifier then demands is unchanged: for math-verify, the extracted text
alone must be the number ("<answer>38</answer>" and "...\n38" count; "<answer>38 apples</answer>"
does not). The default system prompt of these families (`SYSTEM_PROMPT`, used where prompts go
through a chat template: `TrainConfig.system_prompt`) asks for exactly that format.

Splits: as for every task (rl/tasks/base.py `split_of`), a problem whose question text hashes
into bucket 0 of `EVAL_BUCKETS` (sha256) is reserved for the held-out set (`split="eval"`);
training and warm-start problems (`split="train"`) skip it, so no held-out problem is ever
trained on, however small the problem space. `problems(num, seed=s,
split=...)` walks reasoning-gym's items 0, 1, 2, ... of `create_dataset(name, seed=s)` (item i
draws from `random.Random(s + i)`) and keeps the first `num` of the split: the same seed gives
the same problems anywhere. reasoning-gym and math-verify are the optional extra `minite[tasks]`, imported
only when such a task is built.
"""

from __future__ import annotations

import importlib
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .base import (
    MAX_DRAWS_PER_PROBLEM,
    Problem,
    Task,
    check_split_request,
    positional_accuracy,
    split_of,
)

SYSTEM_PROMPT = (
    "Think step by step. Then give only the final answer inside <answer></answer>, "
    "e.g. <answer>42</answer>."
)
"""The reasoning-gym families' system prompt (prompts rendered through a chat template)."""

EXTRA = "pip install 'minite[tasks]'  (reasoning-gym>=0.1.25, math-verify>=0.9)"


@dataclass(frozen=True, kw_only=True)
class RGFamily:
    dataset: str
    """reasoning-gym dataset name (`reasoning_gym.create_dataset(dataset, ...)`)."""
    config: dict[str, Any]
    """Generator settings that keep questions and answers short."""
    verifier: str
    """"math-verify" (numeric answers) or "score_answer" (the dataset's own scorer)."""
    bounds: Callable[[Any], tuple[int, int, str]] = field(repr=False)
    """dataset -> (max prompt chars, max answer chars, alphabet), derived from the config."""


CHAIN_SUM_PREFIX = "State the final answer to the following arithmetic problem: "
SPELL_BACKWARD_PREFIX = "Spell this word backward (example: sun -> nus): "
COUNT_BITS_PREFIX = "How many 1 bits are there in the binary representation of the number "


def _chain_sum_bounds(ds) -> tuple[int, int, str]:
    cfg = ds.config
    if cfg.allow_negation:
        raise ValueError("rg:chain_sum is pinned to allow_negation=False")
    biggest = 10**cfg.max_digits - 1
    terms = cfg.max_terms
    expression = terms * cfg.max_digits + 3 * (terms - 1)  # "a + b - c"
    answer = max(len(str(terms * biggest)), len(str(-(terms - 1) * biggest)))
    alphabet = CHAIN_SUM_PREFIX + string.digits + " +-="
    return len(CHAIN_SUM_PREFIX) + expression + len(" ="), answer, alphabet


def _spell_backward_bounds(ds) -> tuple[int, int, str]:
    longest = max(len(w) for w in ds.words)
    return len(SPELL_BACKWARD_PREFIX) + longest, longest, SPELL_BACKWARD_PREFIX + "".join(ds.words)


def _count_bits_bounds(ds) -> tuple[int, int, str]:
    cfg = ds.config
    # the most 1 bits in [min_n, max_n]: max_n's own, or all ones one bit shorter
    most_ones = max(bin(cfg.max_n).count("1"), cfg.max_n.bit_length() - 1)
    prompt = len(COUNT_BITS_PREFIX) + len(str(cfg.max_n)) + len("?")
    return prompt, len(str(most_ones)), COUNT_BITS_PREFIX + string.digits + "?"


RG_FAMILIES = {
    "rg:chain_sum": RGFamily(
        dataset="chain_sum",
        config=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2),
        verifier="math-verify",
        bounds=_chain_sum_bounds,
    ),
    "rg:spell_backward": RGFamily(
        dataset="spell_backward",
        config=dict(min_word_len=3, max_word_len=5),
        verifier="score_answer",
        bounds=_spell_backward_bounds,
    ),
    "rg:count_bits": RGFamily(
        dataset="count_bits",
        config=dict(min_n=1, max_n=999),
        verifier="math-verify",
        bounds=_count_bits_bounds,
    ),
}


def extract_answer(completion: str) -> str:
    """The answer part of a completion: the last `<answer>...</answer>` block's content, else
    the last non-empty line; stripped either way ("" for an empty completion)."""
    # lazy: reasoning-gym is optional (the tasks extra)
    from reasoning_gym.utils import extract_answer as tagged

    inside = tagged(completion)
    if inside is not None:
        return inside
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _import(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"reasoning-gym tasks need {module!r}: {EXTRA}") from e


class ReasoningGymTask(Task):
    """A reasoning-gym family (`RG_FAMILIES`) as a `Task`. reward: the verifier's score of the
    extracted answer (`extract_answer`; 1.0 for the exact answer), raised to `partial_credit` x
    positional accuracy of the extracted answer when that is higher."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, name: str, *, partial_credit: float = 0.0) -> None:
        if name not in RG_FAMILIES:
            raise ValueError(
                f"reasoning-gym task must be one of {sorted(RG_FAMILIES)}, got {name!r}"
            )
        super().__init__(num_digits=1, partial_credit=partial_credit)
        self.name = name
        self.family = RG_FAMILIES[name]
        rg = _import("reasoning_gym")
        if self.family.verifier == "math-verify":
            self._math_verify = _import("math_verify")
        # one instance for the bounds, the alphabet and score_answer; problems() builds its own
        self._dataset = rg.create_dataset(self.family.dataset, size=1, seed=0, **self.family.config)
        self._max_prompt, self._max_answer, alphabet = self.family.bounds(self._dataset)
        self.alphabet = "".join(sorted(set(alphabet)))

    def problems(self, num: int, *, seed: int, split: str = "train") -> list[Problem]:
        """The first `num` problems of `split` among the items of the dataset seeded `seed`;
        each is checked against the declared widths and alphabet (a generator that outgrows
        them is an error, never truncated)."""
        check_split_request(num, split)
        import reasoning_gym  # lazy: reasoning-gym is optional (the tasks extra)

        limit = MAX_DRAWS_PER_PROBLEM * num  # items to walk before concluding the split is empty
        ds = reasoning_gym.create_dataset(
            self.family.dataset, size=limit, seed=seed, **self.family.config
        )
        out = []
        for index in range(limit):
            entry = ds[index]
            p = Problem(prompt=entry["question"], answer=entry["answer"], task=self.name)
            if split_of(p.prompt) != split:
                continue
            unknown = set(p.prompt + p.answer) - set(self.alphabet)
            if len(p.prompt) > self._max_prompt or len(p.answer) > self._max_answer or unknown:
                raise ValueError(
                    f"{self.name}: problem {p} exceeds the declared widths (prompt <= "
                    f"{self._max_prompt}, answer <= {self._max_answer} chars) or alphabet "
                    f"(unknown {sorted(unknown)}); the installed reasoning-gym generates "
                    "differently from the one these bounds were derived for"
                )
            out.append(p)
            if len(out) == num:
                return out
        raise ValueError(f"{self.name}: fewer than {num} {split} problems in {limit} items")

    def sample(self, rng):
        raise TypeError(f"{self.name} draws through problems(num, seed=...), not sample()")

    def extract_answer(self, completion: str) -> str:
        return extract_answer(completion)

    def verify(self, problem: Problem, completion: str) -> float:
        """The family's verifier of the extracted answer (no partial credit): 1.0 means right."""
        answer = extract_answer(completion)
        if answer == problem.answer:
            return 1.0
        if self.family.verifier == "math-verify":
            mv = self._math_verify
            parsed = mv.parse(answer)
            # parse() extracts a number from any text; the answer must be that number alone
            if not parsed or str(parsed[-1]).strip() != answer:
                return 0.0
            return float(mv.verify(mv.parse(problem.answer), parsed))
        entry = {"question": problem.prompt, "answer": problem.answer}
        return float(self._dataset.score_answer(answer, entry))

    def reward(self, problem: Problem, completion: str) -> float:
        score = self.verify(problem, completion)
        if score >= 1.0:
            return 1.0
        answer = extract_answer(completion)
        return max(score, self.partial_credit * positional_accuracy(answer, problem.answer))

    @property
    def max_prompt_chars(self) -> int:
        return self._max_prompt

    @property
    def max_answer_chars(self) -> int:
        return self._max_answer
