"""Checkpoints: atomic writes, and a clear CheckpointError for every way a file can be wrong
(truncated, altered, not a checkpoint, another kind, another run). Exact: bytes and tensors
round-trip bitwise."""

import os

import pytest
import torch

from fp4_compile.rl.train import checkpoint as ck
from fp4_compile.rl.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    step_path,
)


def _state():
    g = torch.Generator().manual_seed(0)
    return {
        "step": 3,
        "w": torch.randn(4, 4, generator=g),
        "fingerprint": "abc",
        "rng": ck.rng_state(),
    }


def test_round_trip_bitwise(tmp_path):
    state = _state()
    path = save_checkpoint(tmp_path / "a.ckpt", state, kind="grpo")
    back = load_checkpoint(path, kind="grpo", expect={"fingerprint": "abc"})
    assert back["step"] == 3
    assert torch.equal(back["w"].view(torch.int32), state["w"].view(torch.int32))
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]  # no temporary file left behind


def test_truncated_refused(tmp_path):
    path = save_checkpoint(tmp_path / "a.ckpt", _state(), kind="grpo")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path, kind="grpo")


def test_altered_byte_refused(tmp_path):
    path = save_checkpoint(tmp_path / "a.ckpt", _state(), kind="grpo")
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt: sha256"):
        load_checkpoint(path, kind="grpo")


def test_foreign_files_refused(tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save({"step": 1}, plain)
    with pytest.raises(CheckpointError, match="not a minite RL checkpoint"):
        load_checkpoint(plain, kind="grpo")
    path = save_checkpoint(tmp_path / "w.ckpt", _state(), kind="warm_start")
    with pytest.raises(CheckpointError, match="'warm_start' checkpoint, expected 'grpo'"):
        load_checkpoint(path, kind="grpo")
    with pytest.raises(CheckpointError, match="fingerprint: 'abc' -> 'xyz'"):
        load_checkpoint(path, kind="warm_start", expect={"fingerprint": "xyz"})
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.ckpt", kind="grpo")


def test_write_is_atomic_when_interrupted(tmp_path, monkeypatch):
    """A crash between writing and renaming leaves the previous checkpoint intact and no
    temporary file."""
    path = save_checkpoint(tmp_path / "a.ckpt", _state(), kind="grpo")
    before = path.read_bytes()

    def crash(src, dst):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {**_state(), "step": 4}, kind="grpo")
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]
    assert load_checkpoint(path, kind="grpo")["step"] == 3


def test_latest_and_prune(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for step in (2, 10, 4):
        save_checkpoint(ck.step_path(tmp_path, step), {"step": step}, kind="grpo")
    assert latest_checkpoint(tmp_path).name == "step_00000010.ckpt"
    ck.prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_00000004.ckpt",
        "step_00000010.ckpt",
    ]


def test_rng_state_round_trip():
    import random

    state = ck.rng_state()
    a = (torch.rand(3), random.random())
    ck.set_rng_state(state)
    b = (torch.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_damaged_newest_checkpoint_says_how_to_resume_from_the_previous(tmp_path, capsys):
    """`--resume` onto a damaged newest checkpoint: refused before any work, in one line that
    names the damaged file, the intact previous one and the command that resumes from it (or,
    with none intact, --fresh); after that command, the check passes."""
    from fp4_compile.cli import main
    from fp4_compile.rl.train.checkpoint import check_resumable

    folder = tmp_path / "run" / "checkpoints"
    for step in (10, 20):
        save_checkpoint(step_path(folder, step), {"step": step}, kind="grpo")
    newest = step_path(folder, 20)
    data = bytearray(newest.read_bytes())
    data[-5] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert main(["train", "tiny", f"out_dir={tmp_path / 'run'}", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"{str(newest)!r} is corrupt" in err[0], err
    assert f"the previous checkpoint {str(step_path(folder, 10))!r} is intact" in err[0], err
    assert f"mv {newest} {newest}.damaged" in err[0] and "--resume again" in err[0], err
    newest.rename(f"{newest}.damaged")
    check_resumable(folder)  # the command it gave works
    older = step_path(folder, 10)
    older.write_bytes(older.read_bytes()[:-3])  # truncated: nothing intact is left
    with pytest.raises(CheckpointError, match="no earlier checkpoint.*--fresh"):
        check_resumable(folder)
