"""Checkpoints of an RL run: written atomically, verified on load.

File layout: one header line `MINITE-RL-CHECKPOINT v1 <kind> <sha256 of payload> <payload bytes>`
followed by a `torch.save` payload (loaded back with `weights_only=True`). Writing goes to a
temporary file in the same folder, is flushed and fsynced, then `os.replace`d over the target,
so a crash leaves either the old file or the new one, never half of one. Loading refuses, with
a `CheckpointError` naming the file and what is wrong: a file that is not a minite checkpoint, a
different kind, a truncated or altered payload (size or checksum), and (via `expect`) a
checkpoint of another recipe or run configuration.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

MAGIC = b"MINITE-RL-CHECKPOINT"
VERSION = 1
_STEP_FILE = re.compile(r"^step_(\d{8})\.ckpt$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (corrupt, truncated, foreign or mismatched)."""


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any], *, kind: str) -> Path:
    """Atomically write `state` (tensors, dicts, lists, numbers, strings) as a `kind` file."""
    if not re.fullmatch(r"[a-z_]+", kind):
        raise ValueError(f"kind must be lowercase letters and '_', got {kind!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    header = b"%s v%d %s %s %d\n" % (MAGIC, VERSION, kind.encode(), digest.encode(), len(payload))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename durable (POSIX; not possible on every platform)
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        dir_fd = None
    if dir_fd is not None:
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def load_checkpoint(
    path: str | os.PathLike, *, kind: str, expect: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Read and verify a `kind` checkpoint; `expect` maps keys of the state to the values they
    must hold (e.g. the recipe fingerprint), anything else is refused."""
    payload = _verified_payload(Path(path), kind)
    state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    diffs = [d for key, want in (expect or {}).items() for d in _differences(key, state, want)]
    if diffs:
        raise CheckpointError(
            f"{str(path)!r} belongs to another run; what differs (checkpoint -> this run): "
            f"{'; '.join(diffs)}. Resume with the checkpoint's values, or start a new run "
            "(leave --resume out, or pass another out_dir=...)"
        )
    return state


def check_checkpoint(path: str | os.PathLike, *, kind: str) -> None:
    """Raise CheckpointError, naming the file and what is wrong, unless `path` is a whole,
    unaltered `kind` checkpoint (header, size and checksum; the state is not unpickled)."""
    _verified_payload(Path(path), kind)


def _verified_payload(path: Path, kind: str) -> bytes:
    """The payload of a `kind` checkpoint file, its header, size and checksum verified."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    data = path.read_bytes()
    newline = data.find(b"\n", 0, 256)
    parts = data[:newline].split(b" ") if newline > 0 else []
    if len(parts) != 5 or parts[0] != MAGIC:
        raise CheckpointError(
            f"{str(path)!r} is not a minite RL checkpoint (no {MAGIC.decode()} header)"
        )
    version, file_kind, digest, size = (
        parts[1].decode(),
        parts[2].decode(),
        parts[3].decode(),
        parts[4],
    )
    if version != f"v{VERSION}":
        raise CheckpointError(f"{str(path)!r} has format {version}; this minite reads v{VERSION}")
    if file_kind != kind:
        raise CheckpointError(f"{str(path)!r} is a {file_kind!r} checkpoint, expected {kind!r}")
    payload = data[newline + 1 :]
    if not size.isdigit() or len(payload) != int(size):
        raise CheckpointError(
            f"{str(path)!r} is truncated or padded: payload is {len(payload)} bytes, the header "
            f"says {size.decode(errors='replace')}"
        )
    actual = hashlib.sha256(payload).hexdigest()
    if actual != digest:
        raise CheckpointError(f"{str(path)!r} is corrupt: sha256 {actual} != header {digest}")
    return payload


def _differences(key: str, state: dict[str, Any], want: Any) -> list[str]:
    """'key: old -> new' for `key`, or for each differing entry of a dict-valued key
    ('numerics.lr: 0.0005 -> 0.001'); [] when equal."""
    have = state.get(key, "<missing>")
    if have == want:
        return []
    if isinstance(have, dict) and isinstance(want, dict):
        missing = "<missing>"
        return [
            f"{key}.{k}: {have.get(k, missing)!r} -> {want.get(k, missing)!r}"
            for k in sorted(set(have) | set(want), key=str)
            if have.get(k, missing) != want.get(k, missing)
        ]
    return [f"{key}: {have!r} -> {want!r}"]


def step_path(folder: str | os.PathLike, step: int) -> Path:
    return Path(folder) / f"step_{step:08d}.ckpt"


def latest_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The step checkpoint with the highest step in `folder`, or None if there is none."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    steps = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))
    return step_path(folder, steps[-1]) if steps else None


def step_checkpoints(folder: str | os.PathLike) -> list[Path]:
    """The step checkpoints in `folder`, newest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    steps = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))
    return [step_path(folder, s) for s in reversed(steps)]


def check_resumable(folder: str | os.PathLike) -> None:
    """Before a `--resume`: raise CheckpointError if the newest step checkpoint in `folder` is
    damaged, saying which earlier checkpoint is intact and how to resume from it (or that none
    is, and how to start over)."""
    newest, *older = step_checkpoints(folder)
    try:
        check_checkpoint(newest, kind="grpo")
    except CheckpointError as e:
        intact = next((p for p in older if _is_whole(p)), None)
        if intact is None:
            advice = (
                "no earlier checkpoint in the folder is intact: start the run over with --fresh "
                "(or another out_dir=...)"
            )
        else:
            advice = (
                f"the previous checkpoint {str(intact)!r} is intact: move the damaged one aside "
                f"(mv {newest} {newest}.damaged) and run the same command with --resume again "
                f"to continue from {intact.stem}"
            )
        raise CheckpointError(f"--resume: {e}; {advice}") from None


def _is_whole(path: Path) -> bool:
    try:
        check_checkpoint(path, kind="grpo")
    except CheckpointError:
        return False
    return True


def prune_checkpoints(folder: str | os.PathLike, *, keep: int) -> None:
    """Delete all but the `keep` newest step checkpoints."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    folder = Path(folder)
    steps = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))
    for s in steps[:-keep]:
        step_path(folder, s).unlink()


def rng_state() -> dict[str, Any]:
    """Every global RNG stream the loop might touch (torch CPU, CUDA if present, Python)."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
