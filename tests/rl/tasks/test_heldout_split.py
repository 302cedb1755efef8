"""The held-out split of every task (rl/tasks/base.py `split_of`, rl/train/evaluation.py).

Contract, exact (prompts are strings computed in Python): the held-out set and the training
stream are DISJOINT. Every task reserves the prompts whose sha256 falls into bucket 0 of
`EVAL_BUCKETS` for the held-out split; warm-start batches and GRPO prompts draw only from the
rest, so over any number of training draws no held-out problem turns up, even in a problem space
as small as sort's. The check is not vacuous: the unfiltered seeded streams do hold held-out
prompts (with the seed streams alone keeping the sets apart, as before the split, about a third
of the tiny preset's 64 sort held-out problems also occurred among its training prompts)."""

import importlib.util
import random

import pytest

from fp4_compile.rl.tasks.base import EVAL_BUCKETS, split_of
from fp4_compile.rl.tasks.builtin import RG_TASK_NAMES, AdditionTask, SortTask, make_task
from fp4_compile.rl.train.config import derive_seed
from fp4_compile.rl.train.evaluation import heldout_problems

HAS_RG = all(importlib.util.find_spec(m) is not None for m in ("reasoning_gym", "math_verify"))
# (task, num_digits): the built-in tasks at the sizes the presets use, and small spaces
BUILTIN = (("addition", 2), ("addition", 3), ("sort", 3), ("sort", 4), ("mix", 3))


def _training_prompts(task, *, seed, warm_steps, warm_batch, grpo_steps, prompts_per_step):
    """Every prompt a run with these settings trains on (the trainer's and warm start's seeds)."""
    prompts = set()
    for step in range(warm_steps):
        batch = task.problems(warm_batch, seed=derive_seed(seed, "warm", step))
        prompts |= {p.prompt for p in batch}
    for step in range(grpo_steps):
        batch = task.problems(prompts_per_step, seed=derive_seed(seed, "prompts", step))
        prompts |= {p.prompt for p in batch}
    return prompts


@pytest.mark.parametrize(("name", "num_digits"), BUILTIN)
def test_builtin_heldout_set_is_disjoint_from_many_training_draws(name, num_digits):
    """Zero overlap between the 256-problem held-out set and the prompts of 150 warm-start
    batches of 256 and 1000 GRPO steps of 64 prompts (102,400 training draws)."""
    task = make_task(name, num_digits=num_digits)
    heldout = heldout_problems(task, seed=0, size=256)
    assert all(split_of(p.prompt) == "eval" for p in heldout)
    trained = _training_prompts(
        task, seed=0, warm_steps=150, warm_batch=256, grpo_steps=1000, prompts_per_step=64
    )
    overlap = {p.prompt for p in heldout} & trained
    assert not overlap, f"{len(overlap)} held-out prompts trained on, e.g. {sorted(overlap)[:3]}"
    assert all(split_of(p) == "train" for p in trained)


@pytest.mark.parametrize(
    "task", (AdditionTask(num_digits=2), SortTask(num_digits=4)), ids=("addition", "sort")
)
def test_unfiltered_stream_would_train_on_heldout_problems(task):
    """Non-vacuity: the raw seeded stream (`sample`, no split) of the same training seeds holds
    held-out prompts, so it is the split, not luck, that keeps them out of training."""
    heldout = {p.prompt for p in heldout_problems(task, seed=0, size=64)}
    raw = set()
    for step in range(200):
        rng = random.Random(derive_seed(0, "prompts", step))
        raw |= {task.sample(rng).prompt for _ in range(16)}
    assert heldout & raw


def test_split_reserves_about_one_eighth_and_is_a_pure_function_of_the_prompt():
    prompts = [f"s:{i:04d}>" for i in range(10_000)]  # all of sort's 4-digit space
    share = sum(split_of(p) == "eval" for p in prompts) / len(prompts)
    assert abs(share - 1 / EVAL_BUCKETS) < 0.01
    assert [split_of(p) for p in prompts[:100]] == [split_of(p) for p in prompts[:100]]


@pytest.mark.parametrize(("name", "num_digits"), BUILTIN)
def test_split_draws_are_seeded(name, num_digits):
    task = make_task(name, num_digits=num_digits)
    for split in ("train", "eval"):
        assert task.problems(32, seed=5, split=split) == task.problems(32, seed=5, split=split)
        assert task.problems(32, seed=5, split=split) != task.problems(32, seed=6, split=split)
    mixed = task.problems(8, seed=0, split="eval")
    if name == "mix":  # the alternation holds in either split
        assert [p.task for p in mixed] == ["addition", "sort"] * 4


def test_split_and_num_are_checked():
    task = SortTask(num_digits=4)
    with pytest.raises(ValueError, match="split"):
        task.problems(2, seed=0, split="test")
    with pytest.raises(ValueError, match="num"):
        task.problems(0, seed=0)
    with pytest.raises(ValueError, match="num"):
        make_task("mix", num_digits=2).problems(0, seed=0, split="eval")


def test_a_space_too_small_to_split_is_an_error_not_a_hang():
    class OnePrompt(AdditionTask):
        def sample(self, rng):
            rng.random()
            return super().sample(random.Random(0))

    task = OnePrompt(num_digits=1)
    missing = "eval" if split_of(task.sample(random.Random(0)).prompt) == "train" else "train"
    with pytest.raises(ValueError, match="too small to split"):
        task.problems(1, seed=0, split=missing)


@pytest.mark.skipif(not HAS_RG, reason="needs the optional extra minite[tasks]")
@pytest.mark.parametrize("name", RG_TASK_NAMES)
def test_rg_heldout_set_is_disjoint_from_many_training_draws(name):
    """The reasoning-gym families split by the question text the same way."""
    task = make_task(name, num_digits=2)
    heldout = heldout_problems(task, seed=0, size=64)
    trained = _training_prompts(
        task, seed=0, warm_steps=40, warm_batch=64, grpo_steps=100, prompts_per_step=16
    )
    assert {p.prompt for p in heldout}.isdisjoint(trained)
