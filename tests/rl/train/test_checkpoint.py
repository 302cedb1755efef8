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
