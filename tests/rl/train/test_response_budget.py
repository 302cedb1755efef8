"""The response budget `max_new_tokens` of `minite train` (rl/train/config.py, rl/train/trainer.py).

Contracts: 0 keeps the task's answer length (`token_budget`); a positive budget sets the tokens
each rollout sequence may generate, independent of the answer length, and the learner's batch
width (longest prompt + budget); sequences stop at their own EOS within it; under the strict
recipe through the compiled path, learner and rollout log-probs stay equal bit for bit (gap
exactly 0) with the wider rows; a negative budget is a ValueError naming the setting."""

import pytest

from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.run_log import step_records
from fp4_compile.rl.train.trainer import GRPOTrainer, train


def _cfg(tmp_path, **over):
    base = dict(
        steps=1,
        prompts_per_step=2,
        group_size=4,
        warm_start_steps=3,
        warm_start_batch=8,
        checkpoint_every=1,
        compile=False,
        out_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
    )
    return get_preset("tiny").with_overrides([f"{k}={v}" for k, v in {**base, **over}.items()])


def test_zero_budget_keeps_the_answer_length(tmp_path):
    trainer = GRPOTrainer(_cfg(tmp_path), log=lambda *_: None)
    prompt_tokens, answer_tokens = trainer.tok.token_budget(trainer.task)
    assert trainer.max_new_tokens == answer_tokens
    assert trainer.width == prompt_tokens + answer_tokens


def test_negative_budget_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_new_tokens"):
        _cfg(tmp_path, max_new_tokens=-1)


@pytest.mark.slow
def test_budget_sets_generation_and_width_and_keeps_the_bits(tmp_path):
    budget = 12
    cfg = _cfg(tmp_path, max_new_tokens=budget, compile=True)
    result = train(cfg, progress=False, log=lambda *_: None)
    trainer = result["trainer"]
    prompt_tokens, answer_tokens = trainer.tok.token_budget(trainer.task)
    assert budget > answer_tokens
    assert (trainer.max_new_tokens, trainer.width) == (budget, prompt_tokens + budget)
    (record,) = step_records(result["records"])
    assert 0 < record["rollout/mean_new_tokens"] <= budget, record
    assert record["mismatch/max_abs_dlogp"] == 0.0, record
    assert record["mismatch/frac_bitwise_equal"] == 1.0, record
    # a sequence stops at its own EOS: the engine's completions within the budget
    prompts = [trainer.tok.encode_prompt(p.prompt) for p in trainer.task.problems(4, seed=1)]
    out = trainer.engine.generate(
        prompts, max_new_tokens=budget, temperature=1.0, seed=0, eos_token_id=trainer.tok.eos_id
    )
    eos = trainer.tok.eos_id
    for tokens, reason in zip(out.tokens, out.finish_reasons):
        assert eos not in tokens[:-1]
        if reason == "eos":
            assert tokens[-1] == eos and len(tokens) <= budget
        else:
            assert reason == "length" and len(tokens) == budget and eos not in tokens
