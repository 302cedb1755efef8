"""Which folder a `minite train` run writes to, decided before any work (and, for `--nproc N`,
before torchrun starts, so every rank gets the same one).

- No `out_dir=` on the command line: the run folder is `runs/<preset>-<variant>`
  (`runs/<model folder>-<preset>-<variant>` for `model=DIR`). A second run of the same command
  never fails and never touches the first: like PyTorch Lightning's `version_N`, it takes the next
  numbered folder (`runs/tiny-strict-2`, `-3`, ...). `--resume` continues the newest numbered
  folder that holds a checkpoint; `--fresh` starts the newest one over (deleting its checkpoints).
- `out_dir=DIR` given: exactly that folder. One that already holds a run is refused unless
  `--resume` (continue it) or `--fresh` (delete what the earlier run wrote and start over) says
  what to do.
- One run per folder: `claim_run_dir` locks the folder (`fcntl.flock` on `LOCK_NAME` inside it,
  released when the run ends or its process dies) for the whole run. A second run into a busy
  folder is refused, naming the process that holds it; without `out_dir=` it takes the next
  numbered folder instead, so the same command started twice at once runs twice, side by side.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

from ...run_folders import LOCK_NAME, holds_a_run, numbered_run_dirs
from .checkpoint import CheckpointError, check_resumable, latest_checkpoint
from .config import TrainConfig


def out_dir_given(overrides: list[str]) -> bool:
    """Did the user name the run folder (`out_dir=...` / `out-dir=...`) on the command line?"""
    return any(p.partition("=")[0].strip().replace("-", "_") == "out_dir" for p in overrides)


def default_out_dir(cfg: TrainConfig) -> Path:
    """runs/<preset>-<variant>, or runs/<model folder>-<preset>-<variant> for model=DIR (so a
    user's model never shares the demo's folder)."""
    name = f"{cfg.name}-{cfg.variant}"
    if cfg.model:
        name = f"{Path(cfg.model).resolve().name}-{name}"
    return Path("runs") / name


# what a run writes into its folder (rl/train/trainer.py, run_log.py, `minite export`): what
# `--fresh` deletes so that nothing of the earlier run stays beside the new one
RUN_OUTPUTS = ("checkpoints", "export", "tensorboard", "metrics.jsonl", "summary.txt", "*.png")


class RunDirBusy(ValueError):
    """The run folder is locked by another running `minite train`."""


@dataclasses.dataclass
class RunDirLock:
    """The lock of a run folder, held from `lock_run_dir` until `release` (or process exit)."""

    folder: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            import fcntl  # lazy: fcntl is POSIX-only; only the lock needs it

            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def lock_run_dir(folder: Path) -> RunDirLock:
    """Lock `folder` (created if missing) for this process's run; RunDirBusy, naming the process
    that holds it, if another run has it."""
    import fcntl  # lazy: fcntl is POSIX-only; only the lock needs it

    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirBusy(
            f"out_dir {str(folder)!r} is in use by another minite train run (process {holder}): "
            "one run per folder; wait for it to end, or pass another out_dir=..."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return RunDirLock(folder, fd)


def clear_run_outputs(folder: Path) -> list[str]:
    """Delete what an earlier run wrote into `folder` (`RUN_OUTPUTS`: checkpoints, exports,
    logs, plots, summary) for `--fresh`; returns the names deleted."""
    deleted = []
    for pattern in RUN_OUTPUTS:
        for p in sorted(folder.glob(pattern)):
            if p.is_dir():
                shutil.rmtree(p)
                deleted.append(f"{p.name}/")
            else:
                p.unlink()
                deleted.append(p.name)
    return deleted


def discard_empty_run(folder: Path) -> bool:
    """After a run that failed before logging a step: remove what it left (an empty
    metrics.jsonl, its TensorBoard folder, the lock) and the folder itself when nothing else is
    in it, so a failed attempt leaves no run folder behind. Returns whether it did."""
    metrics = folder / "metrics.jsonl"
    if not folder.is_dir() or (metrics.exists() and metrics.read_text().strip()):
        return False
    if latest_checkpoint(folder / "checkpoints") is not None:
        return False
    left = {p.name for p in folder.iterdir()} - {"metrics.jsonl", "tensorboard", LOCK_NAME}
    if left:
        return False
    shutil.rmtree(folder)
    return True


def _next_free(base: Path, start: int) -> tuple[Path, RunDirLock]:
    """The first numbered folder of `base` from `start` on that holds no run and is not locked."""
    n = start
    while True:
        candidate = base if n == 1 else base.parent / f"{base.name}-{n}"
        if not holds_a_run(candidate):
            try:
                return candidate, lock_run_dir(candidate)
            except RunDirBusy:
                pass
        n += 1


def claim_run_dir(
    cfg: TrainConfig, *, explicit: bool, resume: bool, fresh: bool
) -> tuple[TrainConfig, str, RunDirLock]:
    """`resolve_run_dir`, then the folder locked for this run (release the lock when the run
    ends). A busy folder is refused (RunDirBusy), except a new run without `out_dir=`, which
    takes the next free numbered folder. `--fresh` then deletes the earlier run's outputs and
    says which."""
    cfg, note = resolve_run_dir(cfg, explicit=explicit, resume=resume, fresh=fresh)
    folder = Path(cfg.out_dir)
    try:
        lock = lock_run_dir(folder)
    except RunDirBusy:
        if explicit or resume or fresh:
            raise
        base = default_out_dir(cfg)
        m = re.fullmatch(re.escape(base.name) + r"-(\d+)", folder.name)
        busy = folder
        folder, lock = _next_free(base, (int(m.group(1)) if m else 1) + 1)
        cfg = dataclasses.replace(cfg, out_dir=str(folder))
        note = (
            f"run folder: {folder} ({str(busy)!r} is in use by another run started at the same "
            "time; each run gets its own numbered folder)"
        )
    if fresh:
        deleted = clear_run_outputs(folder)
        if deleted:
            note = (note or f"run folder: {folder}") + (
                f"; --fresh deleted the earlier run's {', '.join(deleted)}"
            )
    return cfg, note, lock


def occupied_message(out_dir: Path, latest: Path) -> str:
    return (
        f"out_dir {str(out_dir)!r} already holds a run (latest checkpoint {latest.name}); pass "
        "--resume to continue it, --fresh to delete its checkpoints and start over, or "
        "out_dir=... for another folder"
    )


def resolve_run_dir(
    cfg: TrainConfig, *, explicit: bool, resume: bool, fresh: bool
) -> tuple[TrainConfig, str]:
    """-> (cfg with the run folder in out_dir, a line for the user saying which folder and why,
    or ""). Raises ValueError / CheckpointError, naming the folder and what to pass, for a run that
    cannot start (an occupied explicit folder without --resume / --fresh, --resume with nothing to
    resume)."""
    if explicit:
        out_dir = Path(cfg.out_dir)
        latest = latest_checkpoint(out_dir / "checkpoints")
        if resume and latest is None:
            raise CheckpointError(
                f"--resume: no checkpoint under {str(out_dir / 'checkpoints')!r}; run without "
                "--resume to start this run"
            )
        if latest is not None and not (resume or fresh):
            raise ValueError(occupied_message(out_dir, latest))
        if resume:
            check_resumable(out_dir / "checkpoints")
        return cfg, ""
    base = default_out_dir(cfg)
    runs = numbered_run_dirs(base)
    if resume or fresh:
        with_ckpt = [n for n, p in runs.items() if latest_checkpoint(p / "checkpoints")]
        if not with_ckpt:
            if resume:
                raise CheckpointError(
                    f"--resume: no run folder {str(base)!r} (or {str(base)}-N) holds a checkpoint;"
                    " run without --resume to start one"
                )
            chosen, why = base, "--fresh: nothing to discard"
        else:
            chosen = runs[max(with_ckpt)]
            why = "--resume: the newest run of this preset" if resume else "--fresh: starts over"
    elif not runs:
        chosen, why = base, ""
    else:
        n = max(runs) + 1
        chosen = base.parent / f"{base.name}-{n}"
        why = (
            f"{str(runs[max(runs)])!r} holds an earlier run; each run gets its own numbered "
            "folder (--resume continues the newest, out_dir=... names one)"
        )
    if resume:
        check_resumable(chosen / "checkpoints")
    note = f"run folder: {chosen}" + (f" ({why})" if why else "")
    return dataclasses.replace(cfg, out_dir=str(chosen)), note
