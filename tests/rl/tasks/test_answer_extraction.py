"""Answer extraction of the reasoning-gym tasks (rl/tasks/reasoning_gym.py `extract_answer`).

Contract, exact (strings and rewards are computed in Python): the verifier scores the answer the
completion ends with, the last <answer>...</answer> block, else the last non-empty line, so a
completion that reasons first and then answers right is scored 1.0 (math-verify for the numeric
families, reasoning-gym's own score_answer for spell_backward), and one that reasons and then
answers wrong, or only reasons, is scored below 1.0 (0 for the numeric families), however many
right numbers its reasoning holds. The built-in tasks still score the whole completion."""

import importlib.util

import pytest

from fp4_compile.rl.tasks.builtin import make_task

needs_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("reasoning_gym", "math_verify")),
    reason="needs the optional extra minite[tasks] (reasoning-gym, math-verify)",
)


@needs_extra
def test_extract_answer_takes_the_last_block_else_the_last_line():
    from fp4_compile.rl.tasks.reasoning_gym import extract_answer

    assert extract_answer("38") == "38"
    assert extract_answer("  38 \n") == "38"
    assert extract_answer("47 - 9 is 38.\nSo:\n38\n\n") == "38"
    assert extract_answer("<answer>38</answer>") == "38"
    assert extract_answer("try <answer>12</answer>, no:\n<answer> 38 </answer> done") == "38"
    assert extract_answer("<answer>\n38\n</answer>") == "38"
    assert extract_answer("") == ""
    assert extract_answer("\n \n") == ""


@needs_extra
@pytest.mark.parametrize("name", ["rg:chain_sum", "rg:count_bits"])
def test_reasoning_then_answer_is_scored_by_math_verify(name):
    task = make_task(name, num_digits=2)
    for p in task.problems(40, seed=5):
        right, wrong = p.answer, str(int(p.answer) + 1)
        reasoning = f"Let me think. Maybe {wrong}? No, recount: it is {right}.\n"
        for completion in (
            f"{reasoning}<answer>{right}</answer>",
            f"<think>{reasoning}</think>\n<answer> {right} </answer>",
            f"{reasoning}<answer>{wrong}</answer> hmm <answer>{right}</answer>",
            f"{reasoning}{right}",  # no tags: the last line
            f"{reasoning}<answer>{right}.0</answer>",  # an equivalent form (math-verify)
        ):
            assert task.reward(p, completion) == 1.0, completion
            assert task.extract_answer(completion) in (right, f"{right}.0")
        for completion in (
            f"{reasoning}<answer>{wrong}</answer>",
            f"<answer>{right}</answer> hmm <answer>{wrong}</answer>",  # the last block counts
            f"{reasoning}",  # reasoning only: its last line is no lone number
            f"{reasoning}<answer>{right} apples</answer>",  # the number must stand alone
            f"{reasoning}<answer></answer>",
            f"{reasoning}{wrong}",
        ):
            assert task.reward(p, completion) == 0.0, completion


@needs_extra
def test_reasoning_then_answer_is_scored_by_score_answer():
    task = make_task("rg:spell_backward", num_digits=2)
    for p in task.problems(40, seed=5):
        word = p.prompt.rsplit(": ", 1)[1]
        reasoning = f"The word is {word}. Letters reversed one by one:\n"
        right = f"{reasoning}<answer>{p.answer}</answer>"
        assert task.reward(p, right) == 1.0
        assert task.reward(p, f"{reasoning}{p.answer}") == 1.0
        assert task.reward(p, f"{reasoning}<answer>{word}</answer>") < 1.0 or word == p.answer
        wrong = p.answer[:-1] + ("b" if p.answer[-1] != "b" else "c")
        assert task.reward(p, f"{reasoning}<answer>{wrong}</answer>") < 1.0
        # the reasoning holds the right answer, the final one is wrong: not right
        assert task.reward(p, f"{p.answer}?\n<answer>{wrong}</answer>") < 1.0


def test_builtin_tasks_score_the_whole_completion():
    task = make_task("sort", num_digits=4)
    p = task.problems(1, seed=0)[0]
    assert task.extract_answer(f"x\n{p.answer}") == f"x\n{p.answer}"
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, f"x\n{p.answer}") == 0.0
    assert task.system_prompt == ""
