"""Which folder a `minite train` run writes to, decided before any work (and, for `--nproc N`,
before torchrun starts, so every rank gets the same one).

- No `out_dir=` on the command line: the run folder is `runs/<preset>-<variant>`
  (`runs/<model folder>-<preset>-<variant>` for `model=DIR`). A second run of the same command
  never fails and never touches the first: like PyTorch Lightning's `version_N`, it takes the next
  numbered folder (`runs/tiny-strict-2`, `-3`, ...). `--resume` continues the newest numbered
  folder that holds a checkpoint; `--fresh` starts the newest one over (deleting its checkpoints).
- `out_dir=DIR` given: exactly that folder. One that already holds a run is refused unless
  `--resume` (continue it) or `--fresh` (delete its checkpoints and start over) says what to do.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .checkpoint import CheckpointError, latest_checkpoint
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


def holds_a_run(folder: Path) -> bool:
    """A folder a run has written to: it exists and is not empty."""
    return folder.is_dir() and any(folder.iterdir())


def numbered_run_dirs(base: Path) -> dict[int, Path]:
    """{1: base, 2: base-2, ...} for the numbered folders of `base` that hold a run."""
    found = {1: base} if holds_a_run(base) else {}
    if base.parent.is_dir():
        pattern = re.compile(re.escape(base.name) + r"-(\d+)$")
        for p in base.parent.iterdir():
            m = pattern.match(p.name)
            if m and int(m.group(1)) >= 2 and holds_a_run(p):
                found[int(m.group(1))] = p
    return found


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
    note = f"run folder: {chosen}" + (f" ({why})" if why else "")
    return dataclasses.replace(cfg, out_dir=str(chosen)), note
