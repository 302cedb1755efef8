"""Tokenizer round trips and task verifiers (exact: strings and rewards are computed in Python)."""

import random

import pytest

from fp4_compile.rl.tasks.builtin import (
    AdditionTask,
    Problem,
    SortTask,
    make_task,
    positional_accuracy,
)
from fp4_compile.rl.tasks.tokenizer import CHARACTERS, CharTokenizer


def test_tokenizer_round_trip_every_character():
    tok = CharTokenizer()
    text = CHARACTERS + CHARACTERS[::-1]
    ids = tok.encode(text, bos=True, eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == text
    assert len(set(tok.encode(CHARACTERS, bos=False))) == len(CHARACTERS)


def test_tokenizer_vocab_and_padding():
    tok = CharTokenizer()
    assert tok.vocab_size == 3 + len(CHARACTERS)
    assert tok.padded_vocab_size(16) % 16 == 0 and tok.padded_vocab_size(16) >= tok.vocab_size
    # ids of the padded embedding rows decode as '?' (a wrong answer, not a crash)
    assert tok.decode([tok.padded_vocab_size(16) - 1]) == "?"
    assert tok.decode(tok.encode("12") + [tok.eos_id] + tok.encode("34", bos=False)) == "12"


def test_tokenizer_rejects_unknown_characters():
    with pytest.raises(ValueError, match=r"'#' at position 2"):
        CharTokenizer().encode("12#")
    with pytest.raises(TypeError, match="str"):
        CharTokenizer().encode([1, 2])


def test_addition_problems_and_verifier():
    task = AdditionTask(num_digits=2, partial_credit=0.5)
    for p in task.problems(200, seed=3):
        a, b = p.prompt[:-1].split("+")
        assert len(a) == len(b) == 2 and len(p.answer) == 3
        assert int(p.answer) == int(a) + int(b)
        assert task.reward(p, p.answer) == 1.0
    p = Problem(prompt="37+85=", answer="122", task="addition")
    assert task.reward(p, "121") == pytest.approx(0.5 * 2 / 3)
    assert task.reward(p, "1220") == pytest.approx(0.5 * 3 / 4)  # junk after the answer costs
    assert task.reward(p, "") == 0.0
    assert AdditionTask(num_digits=2).reward(p, "121") == 0.0


def test_sort_problems_and_verifier():
    task = SortTask(num_digits=5)
    for p in task.problems(100, seed=1):
        digits = p.prompt[2:-1]
        assert p.prompt.startswith("s:") and p.prompt.endswith(">") and len(digits) == 5
        assert p.answer == "".join(sorted(digits))
        assert task.reward(p, p.answer) == 1.0
        assert task.reward(p, p.answer[::-1]) == (1.0 if p.answer == p.answer[::-1] else 0.0)


def test_problems_are_seeded():
    task = make_task("mix", num_digits=3)
    assert task.problems(10, seed=7) == task.problems(10, seed=7)
    assert task.problems(10, seed=7) != task.problems(10, seed=8)
    assert [p.task for p in task.problems(4, seed=0)] == ["addition", "sort", "addition", "sort"]
    assert AdditionTask(num_digits=3).sample(random.Random(5)) == AdditionTask(num_digits=3).sample(
        random.Random(5)
    )


def test_every_prompt_encodes():
    tok = CharTokenizer()
    task = make_task("mix", num_digits=4)
    for p in task.problems(50, seed=0):
        assert tok.decode(tok.encode(p.prompt + p.answer, eos=True)) == p.prompt + p.answer
        assert len(p.prompt) <= task.max_prompt_chars and len(p.answer) <= task.max_answer_chars


def test_positional_accuracy():
    assert positional_accuracy("123", "123") == 1.0
    assert positional_accuracy("", "") == 1.0
    assert positional_accuracy("13", "123") == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="mul", num_digits=2), "task must be one of"),
        (dict(name="sort", num_digits=0), "num_digits"),
        (dict(name="sort", num_digits=2, partial_credit=1.0), "partial_credit"),
    ],
)
def test_task_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_task(kwargs.pop("name"), **kwargs)
