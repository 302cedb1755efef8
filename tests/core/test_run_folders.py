"""Run folders' numbering (fp4_compile/run_folders.py), shared by `minite train` and `minite
diagnose`. Contract: a folder counts once it holds something besides the run lock; numbered
siblings `base-N` (N >= 2) count the same way, other names never."""

from fp4_compile.run_folders import LOCK_NAME, holds_a_run, numbered_run_dirs


def test_a_folder_holding_only_the_lock_is_no_run(tmp_path):
    base = tmp_path / "runs" / "tiny-strict"
    assert numbered_run_dirs(base) == {}
    base.mkdir(parents=True)
    (base / LOCK_NAME).write_text("123\n")
    assert not holds_a_run(base) and numbered_run_dirs(base) == {}


def test_numbered_siblings_that_hold_a_run(tmp_path):
    base = tmp_path / "tiny-strict"
    for name in ("tiny-strict", "tiny-strict-3", "tiny-strict-1", "tiny-strict-x", "other-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "tiny-strict-2").mkdir()  # empty: no run
    assert numbered_run_dirs(base) == {1: base, 3: tmp_path / "tiny-strict-3"}
