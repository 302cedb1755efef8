"""The GRPO loop end to end on a tiny Qwen3 (CPU). Contracts, all bitwise: the same seed and
recipe reproduce a run (metrics and weights); a run stopped and resumed from its checkpoint
continues exactly as the uninterrupted run; under the strict recipe through the compiled minite
path, learner and rollout log-probs are equal (gap exactly 0). Loop-logic tests use compile=False
(eager FP32 on both sides) to stay fast."""

import math

import pytest
import torch

from fp4_compile.rl.cli.train import add_train_parser, run_train
from fp4_compile.rl.train.checkpoint import CheckpointError, latest_checkpoint
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.run_log import step_records
from fp4_compile.rl.train.trainer import train


def _cfg(tmp_path, **over):
    base = dict(
        steps=3,
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


def _numbers(records):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k].view(torch.int32), sb[k].view(torch.int32)), k


def _eq(x, y):
    return x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))


def _assert_same_records(ra, rb):
    assert len(ra) == len(rb)
    for a, b in zip(_numbers(ra), _numbers(rb)):
        assert a.keys() == b.keys()
        bad = [k for k in a if not _eq(a[k], b[k])]
        assert not bad, f"step {a['step']}: {bad}"


def test_same_seed_reproduces_bitwise(tmp_path):
    a = train(_cfg(tmp_path / "a"), progress=False, log=lambda *_: None)
    b = train(_cfg(tmp_path / "b"), progress=False, log=lambda *_: None)
    _assert_same_records(a["records"], b["records"])
    _assert_same_weights(a["trainer"].model, b["trainer"].model)
    # the weights reached the engine
    _assert_same_weights(a["trainer"].model, a["trainer"].engine.model)
    c = train(_cfg(tmp_path / "c", seed=1), progress=False, log=lambda *_: None)
    assert _numbers(c["records"]) != _numbers(a["records"])
    for name in ("reward.png", "mismatch.png", "throughput.png", "summary.txt", "metrics.jsonl"):
        assert (tmp_path / "a" / "run" / name).is_file()


def test_resume_continues_bitwise(tmp_path):
    straight = train(
        _cfg(tmp_path / "s", steps=4, kl_coef=0.05, updates_per_batch=2),
        progress=False,
        log=lambda *_: None,
    )
    cfg = _cfg(tmp_path / "r", steps=2, kl_coef=0.05, updates_per_batch=2)
    train(cfg, progress=False, log=lambda *_: None)
    resumed = train(
        cfg.with_overrides(["steps=4"]), resume=True, progress=False, log=lambda *_: None
    )
    # the checkpoint, not the warm start, gave the weights
    assert resumed["trainer"].warm_start == {}
    _assert_same_records(straight["records"], resumed["records"])
    _assert_same_weights(straight["trainer"].model, resumed["trainer"].model)
    opt_a = straight["trainer"].optimizer.state_dict()["state"]
    opt_b = resumed["trainer"].optimizer.state_dict()["state"]
    for k in opt_a:
        assert torch.equal(opt_a[k]["exp_avg_sq"], opt_b[k]["exp_avg_sq"])


def test_resume_refuses_corrupt_or_foreign(tmp_path):
    cfg = _cfg(tmp_path, steps=1)
    train(cfg, progress=False, log=lambda *_: None)
    with pytest.raises(CheckpointError, match="fingerprint"):
        train(cfg.with_overrides(["variant=te"]), resume=True, progress=False, log=lambda *_: None)
    with pytest.raises(CheckpointError, match="numerics"):
        train(cfg.with_overrides(["lr=0.5"]), resume=True, progress=False, log=lambda *_: None)
    with pytest.raises(ValueError, match="--resume to continue"):
        train(cfg, progress=False, log=lambda *_: None)
    path = latest_checkpoint(tmp_path / "run" / "checkpoints")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        train(cfg.with_overrides(["steps=2"]), resume=True, progress=False, log=lambda *_: None)


def test_warm_start_is_cached(tmp_path):
    logs = []
    train(_cfg(tmp_path / "a", steps=1), progress=False, log=logs.append)
    train(
        _cfg(tmp_path / "b", steps=1, cache_dir=str(tmp_path / "a" / "cache")),
        progress=False,
        log=logs.append,
    )
    assert any("warm start: loaded" in m for m in logs)


def test_cli_train(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="minite")
    add_train_parser(parser.add_subparsers(dest="command"))
    over = [
        f"{k}={v}"
        for k, v in dict(
            steps=2,
            prompts_per_step=2,
            group_size=4,
            warm_start_steps=2,
            warm_start_batch=8,
            compile=False,
            out_dir=tmp_path / "run",
            cache_dir=tmp_path / "cache",
        ).items()
    ]
    args = parser.parse_args(["train", "tiny", "--variant", "bf16", "--no-progress", *over])
    assert run_train(args) == 0
    out = capsys.readouterr().out
    assert "minite train tiny --variant bf16" in out and "reward/mean" in out
    with pytest.raises(SystemExit):
        run_train(parser.parse_args(["train", "tiny", "--variant", "fp8"]))


@pytest.mark.slow
def test_tiny_strict_compiled_gap_is_zero(tmp_path):
    """Two GRPO steps through the real path (minite-compiled learner forward + backward and the
    compiled rollout engine, NVFP4 strict): every generated token's learner log-prob equals the
    rollout's bit for bit, at every step, and the weights update."""
    cfg = _cfg(tmp_path, steps=2, compile=True, prompts_per_step=4)
    result = train(cfg, progress=False, log=lambda *_: None)
    for r in step_records(result["records"]):
        assert r["mismatch/max_abs_dlogp"] == 0.0, r
        assert r["mismatch/frac_bitwise_equal"] == 1.0, r
        assert r["correction/is_weight_mean"] == 1.0
    assert result["records"][0]["grad/norm"] > 0
