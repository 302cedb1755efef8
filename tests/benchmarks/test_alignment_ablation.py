"""The alignment ablation (benchmarks/alignment_ablation.py) and its deliberate mismatch
(rl/train/stock_rollout.py), on the CPU.

Contracts: the stock rollout holds exactly the learner's NVFP4 weights (decoded from the bytes
`minite export` writes), yet its log-probs differ from the learner's (gap > 0), while minite's
own engine on the same model matches the learner bit for bit (gap 0); the ablation's summary,
table and plot work on synthetic metrics; `--smoke` runs the whole script end to end."""

import json
import math

import pytest
import torch

from benchmarks import alignment_ablation as ab
from fp4_compile import NVFP4Recipe
from fp4_compile.checkpoints.load import decode_weight
from fp4_compile.checkpoints.plan import plan_export
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.rl.train.stock_rollout import StockRolloutEngine
from fp4_compile.testing import assert_bitwise_equal


def _prompts(num, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 8, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(layers=1).eval()


def test_stock_engine_holds_the_learners_nvfp4_weights(model):
    """Every linear the strict recipe quantizes is the decoded NVFP4 of the learner's bytes, in
    BF16; every other parameter is the learner's, in BF16: the SAME weights."""
    recipe = NVFP4Recipe.strict()
    engine = StockRolloutEngine(model, recipe=recipe, max_batch=4, max_seq_len=32)
    plan = plan_export(model, recipe)
    assert engine.num_nvfp4_linears == len(plan.quantized) > 0
    mine = dict(engine.model.named_parameters())
    decoded = {
        f"{q.name}.weight": decode_weight(q.codes, q.block_scales, q.global_decode)
        for q in plan.quantized
    }
    for name, p in model.named_parameters():
        want = decoded.get(name, p.detach()).to(torch.bfloat16)
        assert_bitwise_equal(mine[name], want, name)
        if name in decoded:  # really quantized: not the master weight rounded to BF16
            assert not torch.equal(mine[name], p.detach().to(torch.bfloat16)), name
    # update_weights follows the learner
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    engine.update_weights(model)
    assert_bitwise_equal(mine["model.norm.weight"], model.model.norm.weight.to(torch.bfloat16))
    with torch.no_grad():
        model.model.norm.weight.sub_(0.5)


@pytest.mark.slow
def test_stock_rollout_differs_from_learner_strict_does_not(model):
    """The same prompts, seeds and weights through (a) minite's engine and (b) the stock engine;
    the minite-compiled strict learner rescores both: (a) bitwise equal, (b) a real gap."""
    recipe = NVFP4Recipe.strict()
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    prompts = _prompts(4, model.config.vocab_size, seed=3)
    gaps = {}
    for name, engine in (
        ("strict", RolloutEngine(model, recipe=recipe, max_batch=4, max_seq_len=32)),
        ("stock", StockRolloutEngine(model, recipe=recipe, max_batch=4, max_seq_len=32)),
    ):
        out = engine.generate(prompts, max_new_tokens=6, temperature=1.0, seed=7)
        seqs = [p + t for p, t in zip(prompts, out.tokens)]
        with torch.no_grad():
            ref = sequence_logprobs(learner, seqs, [len(p) for p in prompts])
        gaps[name] = max(float((a - b).abs().max()) for a, b in zip(out.logprobs, ref))
    assert gaps["strict"] == 0.0
    assert gaps["stock"] > 1e-3, gaps


def test_stock_engine_greedy_and_seeded(model):
    """Greedy decoding is deterministic; a request's samples depend only on its seed (left
    padding masks the other requests' lengths out)."""
    engine = StockRolloutEngine(model, recipe=NVFP4Recipe.strict(), max_batch=4, max_seq_len=32)
    prompts = _prompts(3, model.config.vocab_size, seed=1)
    a = engine.generate(prompts, max_new_tokens=5, temperature=0.0)
    b = engine.generate(prompts, max_new_tokens=5, temperature=0.0)
    assert a.tokens == b.tokens
    batch = engine.generate(prompts, max_new_tokens=5, temperature=1.0, seed=[4, 5, 6])
    again = engine.generate(prompts, max_new_tokens=5, temperature=1.0, seed=[4, 5, 6])
    assert batch.tokens == again.tokens
    assert all(torch.equal(x, y) for x, y in zip(batch.logprobs, again.logprobs))
    assert all(len(t) == 5 and bool((lp <= 0).all()) for t, lp in zip(batch.tokens, batch.logprobs))


def _synthetic_records(steps, *, gap, acc0, acc1, seed, reward_slope=0.5):
    recs = []
    for s in range(steps):
        frac = s / max(1, steps - 1)
        r = {
            "step": s,
            "reward/mean": 0.6 + reward_slope * frac + 0.01 * seed,
            "reward/exact_frac": 0.1 + 0.5 * frac,
            "mismatch/max_abs_dlogp": gap * (1 + frac),
            "rollout_corr/k3_kl": gap * 1e-2,
            "perf/step_s": 0.5,
            "perf/rollout_s": 0.2,
            "perf/learner_s": 0.3,
        }
        if s % 5 == 0:
            r["eval/accuracy"] = acc0 + (acc1 - acc0) * frac
            r["eval/reward"] = r["eval/accuracy"]
        recs.append(r)
    recs.append({"step": steps, "eval/accuracy": acc1, "eval/reward": acc1})
    return recs


def test_summary_table_and_plot_on_synthetic_metrics(tmp_path):
    rows = []
    for variant, gap, acc1 in (("strict", 0.0, 0.6), ("mismatch", 0.8, 0.05)):
        for seed in (0, 1, 2):
            row = {"variant": variant, "setting": "on", "seed": seed, "rc": 0, "wall_s": 1.0}
            recs = _synthetic_records(20, gap=gap, acc0=0.2, acc1=acc1, seed=seed)
            row.update(ab.summarize(recs, steps_planned=20))
            row.update(ab.run_figures(row))
            rows.append(row)
    rows.append({"variant": "te", "setting": "on", "seed": 0, "skipped": "deadline"})
    rows.append(
        {
            "variant": "bf16",
            "setting": "on",
            "seed": 0,
            "rc": 0,
            "wall_s": 1.0,
            **ab.summarize(
                _synthetic_records(20, gap=0.0, acc0=0.2, acc1=0.2, seed=0, reward_slope=-0.5),
                steps_planned=20,
            ),
        }
    )
    rows[-1].update(ab.run_figures(rows[-1]))
    s0 = rows[0]
    assert s0["complete"] and s0["gap_zero_every_step"] and s0["k3_kl_mean"] == 0.0
    assert s0["eval_before"] == 0.2 and s0["eval_after"] == 0.6 and not s0["diverged"]
    m0 = rows[3]  # held-out accuracy fell, but the training reward rose: not diverged
    assert not m0["diverged"] and m0["gap_thirds"][0] < m0["gap_thirds"][2]
    assert rows[-1]["diverged"]  # the training reward fell by 0.5
    assert math.isclose(m0["k3_kl_mean"], 0.008)
    agg = {(e["variant"], e["setting"]): e for e in ab.aggregate(rows)}
    assert set(agg) == {("strict", "on"), ("mismatch", "on"), ("bf16", "on")}
    assert agg["strict", "on"]["seeds"] == [0, 1, 2] and agg["strict", "on"]["diverged"] == 0
    assert agg["mismatch", "on"]["diverged"] == 0 and agg["bf16", "on"]["diverged"] == 1
    assert agg["mismatch", "on"]["takeoff"] == {"steps": [9, 9, 9], "never": 0, "median": 9}
    gain = agg["strict", "on"]["eval_gain"]
    assert math.isclose(gain["mean"], 0.4) and math.isclose(gain["min"], 0.4)
    r = agg["strict", "on"]["reward_last"]
    assert r["min"] < r["mean"] < r["max"]

    class Args:
        preset, seeds, variants, settings = "cpu", "0,1,2", "strict,mismatch,te", "on"

    md = ab.markdown(
        {"gpu": "none (CPU)", "torch": "x", "commit": "abc1234"}, Args, [], rows, ab.aggregate(rows)
    )
    assert "| strict | on | 0,1,2 |" in md and "te (on-policy) seeds 0: deadline" in md
    png = tmp_path / "curves.png"
    ab.plot(rows, png)
    assert 0 < png.stat().st_size < 300_000
    # the numbers without timings: what --seeds 0 must reproduce
    n = ab.numbers_of(s0)
    assert "wall_s" not in n and "perf/step_s" not in n["curves"] and n["eval_after"] == 0.6


def test_run_plan_and_settings():
    variants = ["strict", "mismatch", "bf16", "mismatch-tis", "te"]
    runs = ab.plan("cpu", variants, ["on", "off"], [0, 1])
    assert len(runs) == 5 * 2 + 2 * 2
    # the first 4 variants on every seed, then the others, then the off-policy runs
    assert runs[:4] == [(v, "on", 0) for v in variants[:4]]
    assert runs[4:8] == [(v, "on", 1) for v in variants[:4]]
    assert runs[8:10] == [("te", "on", 0), ("te", "on", 1)]
    assert runs[10:] == [
        ("strict", "off", 0),
        ("mismatch", "off", 0),
        ("strict", "off", 1),
        ("mismatch", "off", 1),
    ]
    on = ab.run_overrides("cpu", "mismatch-tis", "on", 1, [])
    assert "rollout_engine=stock" in on and "tis_cap=2" in on and on[-1] == "seed=1"
    off = ab.run_overrides("cpu", "mismatch", "off", 0, [])
    lr_on = next(x for x in on if x.startswith("lr="))
    lr_off = [x for x in off if x.startswith("lr=")][-1]
    assert float(lr_off[3:]) == pytest.approx(2 * float(lr_on[3:]))
    assert "updates_per_batch=4" in off
    with pytest.raises(ValueError, match="variants"):
        ab.main(["--variants", "strict,nope"])


def test_smoke_runs_end_to_end(tmp_path, monkeypatch):
    """`--smoke`: eager seconds-long runs through the real script (subprocesses, the stock
    engine, the summary, the json, md and png)."""
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("MINITE_COMMIT", "abc1234")
    payload = ab.main(
        [
            "--smoke",
            "--seeds",
            "0",
            "--variants",
            "strict,mismatch",
            "--settings",
            "on",
            "--work-dir",
            str(tmp_path / "work"),
        ]
    )
    rows = payload["rows"]
    assert [(r["variant"], r["rc"], r["steps"]) for r in rows] == [
        ("strict", 0, 3),
        ("mismatch", 0, 3),
    ]
    # eager FP32 on both sides (compile=false): FP32 rounding apart; the stock engine: NVFP4
    # weights, BF16 activations, KV cache: a real gap
    assert rows[0]["gap_max"] < 1e-5 and rows[1]["gap_max"] > 1e-3, rows
    assert all(r["eval_before"] is not None and r["eval_after_step"] == 3 for r in rows)
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 3 and all("alignment_ablation_cpu_smoke" in f for f in files), files
    saved = json.loads(next(out.glob("*.json")).read_text())
    assert saved["rows"][0]["variant"] == "strict" and "curves" in saved["rows"][0]


def test_rows_from_work_reads_finished_running_and_missing_runs(tmp_path):
    """`--from-work`: a finished run (train.log written), one under way (steps logged so far)
    and one not started yet, each reported as what it is."""
    for name, steps, finished in (("strict-on-s0", 300, True), ("mismatch-on-s0", 40, False)):
        run = tmp_path / name
        run.mkdir()
        recs = _synthetic_records(
            steps, gap=0.0 if name.startswith("strict") else 0.5, acc0=0.5, acc1=0.7, seed=0
        )
        if not finished:
            recs = recs[:-1]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        if finished:
            (run / "train.log").write_text("done\n")
    runs = [("strict", "on", 0), ("mismatch", "on", 0), ("bf16", "on", 0)]
    rows = ab.rows_from_work("cpu", runs, tmp_path, ["device=cpu"])
    assert rows[0]["rc"] == 0 and rows[0]["complete"] and rows[0]["steps"] == 300
    assert rows[1]["rc"] == "running" and not rows[1]["complete"] and rows[1]["steps"] == 40
    assert rows[2]["skipped"] == "not run (yet)"
    md = ab.markdown(
        {"gpu": "-", "torch": "-", "commit": "-"},
        type(
            "A",
            (),
            {"preset": "cpu", "seeds": "0", "variants": "strict,mismatch,bf16", "settings": "on"},
        ),
        [],
        rows,
        ab.aggregate(rows),
    )
    assert "| mismatch | on | 0 | 40 (cut) |" in md


def test_takeoff_step_is_the_first_10_step_mean_at_half_reward():
    steps = list(range(100))
    row = {
        "curves": {
            "step": steps,
            "reward/mean": [0.1] * 50 + [0.9] * 50,
            "mismatch/max_abs_dlogp": [0.0] * 100,
            "rollout_corr/k3_kl": [0.0] * 100,
        }
    }
    assert ab.run_figures(row)["takeoff_step"] == 54  # 5 of the last 10 steps at 0.9
    row["curves"]["reward/mean"] = [0.1] * 100
    assert ab.run_figures(row)["takeoff_step"] is None
