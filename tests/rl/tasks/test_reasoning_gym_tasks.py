"""reasoning-gym tasks (rl/tasks/reasoning_gym.py) and the held-out evaluation (rl/train/evaluation.py).

Contracts, exact (strings and rewards are computed in Python): a family's problems are a pure
function of the seed, fit the widths and alphabet it declares, and its verifier gives the exact
answer 1.0 and a wrong one less (math-verify accepting equivalent numeric forms); the built-in
tasks keep the built-in vocabulary; the held-out set is fixed and drawn from a seed stream no
training prompt uses. Bitwise: training records are the same with evaluation on or off, and the
compiled strict run keeps the learner/rollout gap exactly 0 while it evaluates."""

import importlib.util
import sys

import pytest

from fp4_compile.rl.tasks.builtin import RG_TASK_NAMES, make_task
from fp4_compile.rl.tasks.tokenizer import VOCAB_VERSION, CharTokenizer, make_tokenizer
from fp4_compile.rl.train.config import TrainConfig, derive_seed
from fp4_compile.rl.train.evaluation import heldout_problems
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.run_log import step_records
from fp4_compile.rl.train.trainer import train

needs_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("reasoning_gym", "math_verify")),
    reason="needs the optional extra minite[tasks] (reasoning-gym, math-verify)",
)


def _run_cfg(tmp_path, **over):
    base = dict(
        steps=2,
        warm_start_steps=2,
        warm_start_batch=8,
        prompts_per_step=2,
        group_size=2,
        eval_every=1,
        eval_size=4,
        checkpoint_every=10,
        compile=False,
        out_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
    )
    return get_preset("tiny").with_overrides([f"{k}={v}" for k, v in {**base, **over}.items()])


def test_rg_names_match_the_families_and_unknown_names_list_them():
    from fp4_compile.rl.tasks.reasoning_gym import RG_FAMILIES

    assert set(RG_TASK_NAMES) == set(RG_FAMILIES)
    with pytest.raises(ValueError, match="rg:chain_sum"):
        TrainConfig(task="rg:no_such_family")


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym -> ImportError
    with pytest.raises(ImportError, match=r"minite\[tasks\]"):
        make_task("rg:chain_sum", num_digits=2)


def test_builtin_tasks_keep_the_builtin_vocabulary():
    builtin = CharTokenizer().to_dict()
    assert builtin["vocab_version"] == VOCAB_VERSION == 1
    for name in ("addition", "sort", "mix"):
        assert make_tokenizer("", make_task(name, num_digits=3)).to_dict() == builtin


@needs_extra
@pytest.mark.parametrize("name", RG_TASK_NAMES)
def test_rg_problems_are_seeded_and_fit_the_declared_widths(name):
    task = make_task(name, num_digits=2)
    problems = task.problems(2000, seed=3)
    assert problems == task.problems(2000, seed=3)
    assert problems != task.problems(2000, seed=4)
    assert {p.task for p in problems} == {name}
    # the bounds come from the generator's config; a large sample reaches them exactly
    assert max(len(p.prompt) for p in problems) == task.max_prompt_chars
    assert max(len(p.answer) for p in problems) == task.max_answer_chars
    tok = make_tokenizer("", task)
    # the built-in ids do not move; the task's extra characters come after them
    assert tok.tokens[: CharTokenizer().vocab_size] == CharTokenizer().tokens
    max_prompt_tokens, max_answer_tokens = tok.token_budget(task)
    for p in problems:
        assert len(tok.encode_prompt(p.prompt)) <= max_prompt_tokens
        assert len(tok.encode_answer(p.answer)) <= max_answer_tokens
        assert tok.decode(tok.encode(p.prompt + p.answer)) == p.prompt + p.answer


@needs_extra
def test_chain_sum_verified_by_math_verify():
    task = make_task("rg:chain_sum", num_digits=2, partial_credit=0.0)
    for p in task.problems(50, seed=0):
        value = int(p.answer)
        assert task.reward(p, p.answer) == 1.0
        assert task.reward(p, f"{value}.0") == 1.0  # an equivalent form
        assert task.reward(p, str(value + 1)) == 0.0
        assert task.reward(p, f"{p.answer}x") == 0.0  # the number must be the whole completion
        assert task.reward(p, "") == 0.0
    p = task.problems(1, seed=0)[0]
    partial = make_task("rg:chain_sum", num_digits=2, partial_credit=0.5)
    assert 0.0 < partial.reward(p, p.answer[:-1] + "?") < 1.0


@needs_extra
def test_count_bits_verified_by_math_verify():
    task = make_task("rg:count_bits", num_digits=2)
    assert (task.max_prompt_chars, task.max_answer_chars) == (73, 1)
    for p in task.problems(200, seed=0):
        number = int(p.prompt.rsplit(" ", 1)[1].rstrip("?"))
        assert 1 <= number <= 999 and p.answer == str(bin(number).count("1"))
        assert task.reward(p, p.answer) == 1.0
        assert task.reward(p, f"{p.answer}.0") == 1.0  # an equivalent form
        assert task.reward(p, str(int(p.answer) + 1)) == 0.0
        assert task.reward(p, f"{p.answer} bits") == 0.0  # the number must be the whole completion


@needs_extra
def test_spell_backward_verified_by_score_answer():
    task = make_task("rg:spell_backward", num_digits=2)
    for p in task.problems(50, seed=0):
        assert p.answer == p.prompt.rsplit(": ", 1)[1][::-1]
        assert task.reward(p, p.answer) == 1.0
        assert task.reward(p, p.answer.upper()) == 1.0  # score_answer ignores case
        wrong = p.answer[:-1] + ("b" if p.answer[-1] != "b" else "c")
        assert task.reward(p, wrong) < 1.0
        assert task.reward(p, "") == 0.0


@needs_extra
@pytest.mark.parametrize("name", ("sort",) + RG_TASK_NAMES)
def test_heldout_set_is_fixed_and_from_its_own_seed_stream(name):
    task = make_task(name, num_digits=4)
    heldout = heldout_problems(task, seed=0, size=64)
    assert heldout == heldout_problems(task, seed=0, size=64)
    assert heldout != heldout_problems(task, seed=1, size=64)
    # reasoning-gym item i of seed s draws from Random(s + i), and problems(num) walks at most
    # 64 * EVAL_BUCKETS * num items: the held-out items' generator seeds are disjoint from every
    # training step's and warm-start batch's
    walk = 64 * 8
    eval_lo = derive_seed(0, "eval")
    eval_hi = eval_lo + walk * 64
    for phase, per_step in (("prompts", 16), ("warm", 64)):
        for step in range(1000):
            lo = derive_seed(0, phase, step)
            assert lo + walk * per_step <= eval_lo or eval_hi <= lo


@needs_extra
@pytest.mark.parametrize("name", RG_TASK_NAMES)
def test_rg_heldout_problems_are_never_trained_on(name):
    """The rg: tasks, like every task, reserve 1/EVAL_BUCKETS of the problem space for the held-out set: no
    warm-start or GRPO prompt is a held-out one, even where the space is small."""
    from fp4_compile.rl.tasks.base import EVAL_BUCKETS, split_of

    task = make_task(name, num_digits=2)
    heldout = {p.prompt for p in heldout_problems(task, seed=0, size=64)}
    assert all(split_of(p) == "eval" for p in heldout)
    trained = {
        p.prompt for s in range(60) for p in task.problems(64, seed=derive_seed(0, "warm", s))
    }
    trained |= {
        p.prompt for s in range(30) for p in task.problems(8, seed=derive_seed(0, "prompts", s))
    }
    assert heldout.isdisjoint(trained)
    assert not any(split_of(p.prompt) == "eval" for p in task.problems(2000, seed=9))
    # about 1/EVAL_BUCKETS of the prompts are reserved
    share = sum(split_of(f"{i}") == "eval" for i in range(8000)) / 8000
    assert abs(share - 1 / EVAL_BUCKETS) < 0.02
    with pytest.raises(ValueError, match="split"):
        task.problems(2, seed=0, split="test")


def _without_eval(records):
    return [
        {k: v for k, v in r.items() if not k.startswith(("eval/", "perf/"))}
        for r in step_records(records)
    ]


def test_eval_does_not_change_training(tmp_path):
    """Eager loop (fast): the training records with eval every step equal those without."""
    on = train(_run_cfg(tmp_path / "on", task="sort"), progress=False, log=lambda *_: None)
    off = train(
        _run_cfg(tmp_path / "off", task="sort", eval_every=0), progress=False, log=lambda *_: None
    )
    assert [r["step"] for r in on["records"] if "eval/accuracy" in r] == [0, 1, 2]
    assert not any("eval/accuracy" in r for r in off["records"])
    assert len(_without_eval(on["records"])) == 2
    assert _without_eval(on["records"]) == _without_eval(off["records"])
    assert "eval/accuracy" in on["summary"]


@needs_extra
@pytest.mark.slow
def test_rg_compiled_run_evaluates_and_keeps_the_gap_zero(tmp_path):
    """`minite train tiny task=rg:chain_sum steps=2 ... eval_every=1 eval_size=4` through the
    compiled strict path: eval/accuracy at steps 0, 1, 2 (2 = the final weights); learner and
    rollout log-probs equal bit for bit at every step."""
    cfg = _run_cfg(tmp_path, task="rg:chain_sum", compile=True)
    records = train(cfg, progress=False, log=lambda *_: None)["records"]
    assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 1, 2]
    assert [r["step"] for r in step_records(records)] == [0, 1]
    for r in step_records(records):
        assert r["mismatch/max_abs_dlogp"] == 0.0, r
        assert r["mismatch/frac_bitwise_equal"] == 1.0, r


@pytest.mark.slow
def test_compiled_training_is_the_same_with_eval_on_or_off(tmp_path):
    """Compiled strict (NVFP4 forward and backward with its stochastic-rounding streams): the
    training records with a greedy evaluation before every step equal those without."""
    on = train(
        _run_cfg(tmp_path / "on", task="sort", compile=True), progress=False, log=lambda *_: None
    )
    off = train(
        _run_cfg(
            tmp_path / "off",
            task="sort",
            compile=True,
            eval_every=0,
            cache_dir=str(tmp_path / "on" / "cache"),
        ),
        progress=False,
        log=lambda *_: None,
    )
    assert [r["step"] for r in on["records"] if "eval/accuracy" in r] == [0, 1, 2]
    assert len(_without_eval(on["records"])) == 2
    assert _without_eval(on["records"]) == _without_eval(off["records"])


def test_tiny_rg_preset_names_a_reasoning_gym_task():
    cfg = get_preset("tiny-rg")
    assert cfg.task in RG_TASK_NAMES and cfg.out_dir == "runs/tiny-rg-strict"
    assert get_preset("tiny").task == "sort"  # the main job's task is unchanged


@needs_extra
def test_rg_problem_beyond_the_declared_width_is_an_error():
    task = make_task("rg:spell_backward", num_digits=2)
    task._max_prompt -= 1  # as if the generator had outgrown its bound: raise, never truncate
    with pytest.raises(ValueError, match="declared widths"):
        task.problems(200, seed=0)
