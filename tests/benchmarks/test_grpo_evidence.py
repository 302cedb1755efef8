"""`benchmarks.grpo_evidence` end to end on the CPU (`--smoke`: the presets shrunk to a tiny
model and three steps, the same code path as the device run): every run finishes, the one results
file is written (md, json, png, runs archive without checkpoints), the held-out accuracy before
and after GRPO is reported, and mistakes in the settings fail before the first run starts.
Contract: exact (file contents and counts), no timing."""

import json
import tarfile

import pytest

from benchmarks.grpo_evidence import main, summarize


def _outputs(out):
    files = sorted(p.name for p in out.iterdir())
    stems = {name.split("_grpo_h200-evidence_")[0] for name in files}
    assert len(stems) == 1, files
    return files


@pytest.mark.slow
def test_smoke_run_writes_one_results_file(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("MINITE_COMMIT", "abc1234")
    main(
        [
            "--smoke",
            "--presets",
            "h200-evidence",
            "--variants",
            "strict,te",
            "--work-dir",
            str(tmp_path / "work"),
        ]
    )
    files = _outputs(out)
    assert [f.rsplit("abc1234", 1)[1] for f in files] == [".json", ".md", ".png", "_runs.tgz"]
    payload = json.loads((out / files[0]).read_text())
    assert [(r["preset"], r["variant"]) for r in payload["rows"]] == [
        ("h200-evidence", "strict"),
        ("h200-evidence", "te"),
    ]
    for r in payload["rows"]:
        assert r["rc"] == 0 and r["complete"] and r["steps"] == 3, r
        assert r["eval_before"] is not None and r["eval_after_step"] == 3
        assert len(r["curves"]["step"]) == 3 and r["curves"]["eval_step"] == [0, 2, 3]
    md = (out / files[1]).read_text()
    assert "| h200-evidence | strict | 3 |" in md and "| h200-evidence | te | 3 |" in md
    assert "strict vs bf16 held-out accuracy: not measured" in md  # bf16 not among the variants
    assert (out / files[2]).stat().st_size > 10_000
    with tarfile.open(out / files[3]) as tar:
        names = tar.getnames()
    for variant in ("strict", "te"):
        assert f"h200-evidence-{variant}/metrics.jsonl" in names
        assert f"h200-evidence-{variant}/train.log" in names
    assert not [n for n in names if n.endswith(".ckpt")]


def test_runs_past_the_deadline_are_skipped_and_reported(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("MINITE_COMMIT", "abc1234")
    main(["--smoke", "--deadline-s", "0", "--work-dir", str(tmp_path / "work")])
    files = _outputs(out)
    payload = json.loads((out / files[0]).read_text())
    assert [r.get("skipped") for r in payload["rows"]] == ["deadline"] * 3
    assert "| h200-evidence | strict | not run: deadline |" in (out / files[1]).read_text()


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--smoke", "stpes=3"], "did you mean 'steps'"),
        (["--smoke", "--variants", "strict,fp8"], "--variants"),
        (["--smoke", "--presets", "h200-nope"], "preset must be one of"),
    ],
)
def test_bad_settings_fail_before_any_run(tmp_path, monkeypatch, argv, match):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    with pytest.raises(ValueError, match=match):
        main([*argv, "--work-dir", str(tmp_path / "work")])
    assert not (tmp_path / "work").exists()


def test_summarize_reads_steps_and_evaluations():
    flat = {"reward/exact_frac": 0.0, "mismatch/max_abs_dlogp": 0.0, "rollout_corr/k3_kl": 0.0}
    times = {"perf/step_s": 1.0, "perf/rollout_s": 0.5, "perf/learner_s": 0.5}
    records = [{"step": s, "reward/mean": 0.1 * s, **flat, **times} for s in range(4)]
    records[0]["eval/accuracy"] = 0.25
    records[2]["eval/accuracy"] = 0.5
    records.append({"step": 4, "eval/accuracy": 0.75})  # the final weights' record
    row = summarize(records, steps_planned=4)
    assert (row["steps"], row["complete"]) == (4, True)
    assert (row["eval_before"], row["eval_after"], row["eval_after_step"]) == (0.25, 0.75, 4)
    assert row["gap_zero_every_step"] and row["reward_last"] == pytest.approx(0.15)
    assert summarize(records[:2], steps_planned=4)["complete"] is False
