"""Run folders of `minite train` (rl/train/run_dir.py). Contract: the same command run twice just
works, each run in its own folder (Lightning's version_N habit: runs/tiny-strict, then
runs/tiny-strict-2), and nothing an earlier run wrote is touched; `--resume` without out_dir=
continues the newest; `model=DIR` gets a folder named after the model, never the preset's; an
explicit out_dir= that holds a run is refused, naming the folder and --resume / --fresh, before
any work (and, for --nproc 2, before torchrun starts)."""

import time

import pytest

from fp4_compile.cli import main
from fp4_compile.rl.train.checkpoint import CheckpointError
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.run_dir import default_out_dir, out_dir_given, resolve_run_dir

# the quick-start command, cut to seconds: eager FP32 (no compile), one GRPO step
CHEAP = [
    "steps=1",
    "warm_start_steps=1",
    "warm_start_batch=4",
    "prompts_per_step=2",
    "group_size=2",
    "eval_every=0",
    "compile=false",
    "--no-progress",
]


def _fake_run(folder, step=1):
    from fp4_compile.rl.train.checkpoint import save_checkpoint, step_path

    save_checkpoint(step_path(folder / "checkpoints", step), {"step": step}, kind="grpo")
    (folder / "metrics.jsonl").write_text("{}\n")


def test_same_command_twice_gets_a_new_numbered_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "tiny", *CHEAP]) == 0
    first = (tmp_path / "runs" / "tiny-strict" / "metrics.jsonl").read_bytes()
    assert main(["train", "tiny", *CHEAP]) == 0  # the second run of the same command
    out = capsys.readouterr().out
    assert "run folder: runs/tiny-strict-2" in out, out
    assert (tmp_path / "runs" / "tiny-strict-2" / "summary.txt").is_file()
    assert (tmp_path / "runs" / "tiny-strict" / "metrics.jsonl").read_bytes() == first
    # --resume continues the newest run (here: 1 more step of runs/tiny-strict-2)
    assert main(["train", "tiny", *CHEAP, "--resume", "steps=2"]) == 0
    out = capsys.readouterr().out
    assert "run folder: runs/tiny-strict-2 (--resume" in out, out
    assert not (tmp_path / "runs" / "tiny-strict-3").exists()


def test_numbering_and_resume_pick(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = get_preset("tiny")
    assert resolve_run_dir(cfg, explicit=False, resume=False, fresh=False)[0].out_dir == (
        "runs/tiny-strict"
    )
    with pytest.raises(CheckpointError, match="--resume: no run folder 'runs/tiny-strict'"):
        resolve_run_dir(cfg, explicit=False, resume=True, fresh=False)
    _fake_run(tmp_path / "runs" / "tiny-strict")
    _fake_run(tmp_path / "runs" / "tiny-strict-3")
    (tmp_path / "runs" / "tiny-strict-4").mkdir()  # empty: not a run
    new = resolve_run_dir(cfg, explicit=False, resume=False, fresh=False)
    assert new[0].out_dir == "runs/tiny-strict-4" and "tiny-strict-3" in new[1]
    resumed = resolve_run_dir(cfg, explicit=False, resume=True, fresh=False)[0]
    assert resumed.out_dir == "runs/tiny-strict-3"
    te = get_preset("tiny", "te")
    assert resolve_run_dir(te, explicit=False, resume=False, fresh=False)[0].out_dir == (
        "runs/tiny-te"
    )
    assert out_dir_given(["steps=3", "out-dir=x"]) and not out_dir_given(["steps=3"])


def test_explicit_occupied_out_dir_is_refused_before_any_work(tmp_path, capsys):
    run = tmp_path / "k"
    _fake_run(run, step=10)
    for extra in ([], ["--nproc", "2"]):
        t0 = time.perf_counter()
        assert main(["train", "tiny", f"out_dir={run}", *extra]) == 2
        took = time.perf_counter() - t0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err  # one line: no torchrun, no traceback
        assert f"out_dir {str(run)!r} already holds a run" in err[0]
        assert "--resume" in err[0] and "--fresh" in err[0]
        assert took < 15, took
    assert main(["train", "tiny", f"out_dir={tmp_path / 'none'}", "--resume"]) == 2
    assert "--resume: no checkpoint under" in capsys.readouterr().err


def test_nproc_preflight_checks_divisibility(tmp_path, capsys):
    assert (
        main(["train", "tiny", f"out_dir={tmp_path / 'a'}", "prompts_per_step=3", "--nproc", "2"])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prompts_per_step=3 must be a multiple of --nproc 2" in err[0], err


def test_model_dir_gets_its_own_folder(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    cfg = get_preset("tiny").with_overrides([f"model={tiny_model_dir}"])
    assert default_out_dir(cfg).as_posix() == f"runs/{tiny_model_dir.name}-tiny-strict"
    _fake_run(tmp_path / "runs" / "tiny-strict")  # the demo's run is not in the way
    chosen = resolve_run_dir(cfg, explicit=False, resume=False, fresh=False)[0]
    assert chosen.out_dir == f"runs/{tiny_model_dir.name}-tiny-strict"


def test_refused_resume_names_only_what_differs(tmp_path, capsys):
    """`--resume lr=1e-3` on a run made with the preset's lr: one line naming lr, old -> new,
    not the two settings dicts."""
    run = f"out_dir={tmp_path / 'k'}"
    assert main(["train", "tiny", *CHEAP, run]) == 0
    capsys.readouterr()
    assert main(["train", "tiny", *CHEAP, run, "--resume", "lr=1e-3", "steps=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "what differs (checkpoint -> this run): numerics.lr: 0.0005 -> 0.001." in err[0], err
    assert "warm_start_lr" not in err[0] and "{" not in err[0], err


def test_a_busy_folder_is_refused_or_skipped(tmp_path, monkeypatch, capsys):
    """One run per folder: while a run holds its folder (its lock, as a second process would
    see it), a second run with out_dir= naming it is refused in one line naming the holder; the
    same command without out_dir= takes the next numbered folder; the lock goes with the run."""
    import subprocess
    import sys

    from fp4_compile.rl.train.run_dir import claim_run_dir

    monkeypatch.chdir(tmp_path)
    busy = tmp_path / "runs" / "tiny-strict"
    holder = subprocess.Popen(  # another process holding the folder's lock, as a live run does
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from fp4_compile.rl.train.run_dir import lock_run_dir; "
            f"lock = lock_run_dir(Path({str(busy)!r})); print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["train", "tiny", f"out_dir={busy}", *CHEAP]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert f"out_dir {str(busy)!r} is in use by another minite train run (process " in err[0]
        assert f"{holder.pid})" in err[0], err
        assert not (busy / "metrics.jsonl").exists()
        # without out_dir=: the folder looks free (nothing written yet) but is busy -> the next
        cfg, note, lock = claim_run_dir(
            get_preset("tiny"), explicit=False, resume=False, fresh=False
        )
        try:
            assert cfg.out_dir == "runs/tiny-strict-2", cfg.out_dir
            assert "'runs/tiny-strict' is in use by another run" in note, note
        finally:
            lock.release()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock with it
    mine = get_preset("tiny").with_overrides([f"out_dir={busy}"])
    cfg, _, lock = claim_run_dir(mine, explicit=True, resume=False, fresh=False)
    assert cfg.out_dir == str(busy)
    lock.release()


def test_fresh_deletes_the_earlier_runs_outputs_and_says_so(tmp_path, capsys):
    """`--fresh` starts over: the earlier run's checkpoints, export/, logs and plots are gone
    (nothing of it stays beside the new run), and the note names what was deleted."""
    run = tmp_path / "k"
    _fake_run(run, step=10)
    (run / "export" / "compressed-tensors-step_10").mkdir(parents=True)
    (run / "reward.png").write_bytes(b"png")
    assert main(["train", "tiny", f"out_dir={run}", *CHEAP, "--fresh"]) == 0
    out = capsys.readouterr().out
    assert "--fresh deleted the earlier run's checkpoints/, export/" in out, out
    assert "reward.png" in out and "metrics.jsonl" in out, out
    assert not (run / "export").exists()
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000001.ckpt"]


def test_a_run_that_fails_before_its_first_step_leaves_no_folder(tmp_path, monkeypatch, capsys):
    """A run that fails before it logs a step (a compile error, say) leaves no run folder with an
    empty metrics.jsonl behind, so the next attempt takes the same folder."""
    from fp4_compile.rl.train import trainer as trainer_module

    def fails(self):
        raise RuntimeError("the first step failed")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer_module.GRPOTrainer, "train_step", fails)
    assert main(["train", "tiny", *CHEAP]) == 2
    assert "the first step failed" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "tiny-strict").exists()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["train", "tiny", *CHEAP]) == 0
    assert "run folder: runs/tiny-strict\n" in capsys.readouterr().out
