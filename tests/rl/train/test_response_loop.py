"""minite's own loop as RL users configure it: a response budget independent of the answer
length, each sequence stopping at its own EOS, rewards from the extracted answers, and a learner
that computes on the real lengths (rl/train/batching.py).

Contracts. Exact (integers, strings): the learner's width buckets are few, ascending, end at the
full width and hold every length; a packed batch's mask covers each completion up to and
including its EOS and nothing after it. Bitwise, the bar of issue 46: `minite train tiny-rg
max_new_tokens=48` (compiled strict, rg:chain_sum) generates completions that end at EOS with
different lengths, well inside the budget; the rewards are the verifier's scores of the answers
extracted from the completions; learner and rollout log-probs are equal bit for bit; the learner's
batch is as wide as the longest real sequence's bucket, not prompt + 48 (padding past it costs no
learner work), and the learner's log-probs at that width equal, bit for bit, those at the full
width."""

import importlib.util

import pytest
import torch

from fp4_compile.rl.train.batching import NUM_BUCKETS, learner_width, pack_batch, width_buckets
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.run_log import step_records
from fp4_compile.rl.train.trainer import train

needs_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("reasoning_gym", "math_verify")),
    reason="needs the optional extra minite[tasks] (reasoning-gym, math-verify)",
)


def test_width_buckets():
    assert width_buckets(11) == (11,)  # the tiny preset: one width, as before
    assert width_buckets(118) == (16, 32, 48, 64, 80, 96, 112, 118)
    for full in (2, 5, 16, 17, 74, 118, 1000, 4133):
        buckets = width_buckets(full)
        assert len(buckets) <= NUM_BUCKETS and buckets[-1] == full
        assert list(buckets) == sorted(set(buckets))
        for longest in range(1, full + 1):
            w = learner_width(longest, full)
            assert longest <= w <= full and w in buckets
    with pytest.raises(ValueError, match="longest"):
        learner_width(119, 118)
    with pytest.raises(ValueError, match="full_width"):
        width_buckets(1)


def test_pack_batch_masks_each_completion_up_to_its_eos():
    eos, pad = 2, 0
    prompts = [[1, 5, 6], [1, 7]]
    tokens = [[8, 9, eos], [8, eos]]  # the engine's rows end at their own EOS
    logps = [torch.tensor([-0.5, -0.25, -0.125]), torch.tensor([-1.0, -2.0])]
    ids, mask, rollout_logp = pack_batch(prompts, tokens, logps, pad_id=pad, width=8)
    assert ids.tolist() == [[1, 5, 6, 8, 9, eos, pad, pad], [1, 7, 8, eos, pad, pad, pad, pad]]
    assert mask.tolist() == [[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0, 0]]
    assert rollout_logp[0, 2:5].tolist() == [-0.5, -0.25, -0.125]
    assert rollout_logp[1, 1:3].tolist() == [-1.0, -2.0]
    assert rollout_logp[mask == 0].eq(0).all()
    with pytest.raises(ValueError, match="width"):
        pack_batch(prompts, tokens, logps, pad_id=pad, width=5)


@needs_extra
@pytest.mark.slow
def test_train_reasoning_gym_with_a_response_budget(tmp_path):
    over = dict(
        max_new_tokens=48,
        steps=1,
        prompts_per_step=2,
        group_size=4,
        warm_start_steps=10,
        warm_start_batch=32,
        eval_every=0,
        checkpoint_every=10,
        out_dir=tmp_path / "run",
        cache_dir=tmp_path / "cache",
    )
    cfg = get_preset("tiny-rg").with_overrides([f"{k}={v}" for k, v in over.items()])
    assert cfg.task == "rg:chain_sum" and cfg.compile and cfg.variant == "strict"
    result = train(cfg, progress=False, log=lambda *_: None)
    trainer = result["trainer"]
    (record,) = step_records(result["records"])
    out, eos = trainer.last_rollout["output"], trainer.tok.eos_id

    # completions end at their own EOS, with different lengths, inside the budget
    lengths = [len(t) for t in out.tokens]
    assert out.finish_reasons == ["eos"] * len(lengths) and record["rollout/eos_frac"] == 1.0
    for tokens in out.tokens:
        assert tokens[-1] == eos and eos not in tokens[:-1]
    assert len(set(lengths)) > 1 and max(lengths) < 48, lengths
    assert (record["rollout/min_new_tokens"], record["rollout/max_new_tokens"]) == (
        min(lengths),
        max(lengths),
    )

    # rewards: the verifier's score of each extracted answer
    task, group = trainer.task, cfg.group_size
    problems, completions = trainer.last_rollout["problems"], trainer.last_rollout["completions"]
    assert completions == [trainer.tok.decode(t) for t in out.tokens]
    for i, (c, r) in enumerate(zip(completions, trainer.last_rollout["rewards"])):
        p = problems[i // group]
        assert r == task.reward(p, c)
        assert (r == 1.0) == (task.verify(p, c) == 1.0 == task.verify(p, task.extract_answer(c)))

    # learner == rollout, bit for bit
    assert record["mismatch/max_abs_dlogp"] == 0.0, record
    assert record["mismatch/frac_bitwise_equal"] == 1.0, record

    # the learner's batch: the longest real sequence's bucket, not prompt + 48
    prompts = trainer.last_rollout["prompts"]
    longest = max(len(p) + n for p, n in zip(prompts, lengths))
    width = learner_width(longest, trainer.width)
    assert record["perf/learner_width"] == width < trainer.width == trainer.max_prompt_tokens + 48
    # at the trimmed width the learner's log-probs are those of the full width, bit for bit
    logps = {}
    for w in (width, trainer.width):
        ids, mask, _ = pack_batch(prompts, out.tokens, out.logprobs, pad_id=0, width=w)
        with torch.no_grad():
            logps[w] = trainer._logprobs(trainer.learner, ids)[:, : width - 1]
    assert torch.equal(
        logps[width][mask[:, : width - 1] > 0].view(torch.int32),
        logps[trainer.width][mask[:, : width - 1] > 0].view(torch.int32),
    )
