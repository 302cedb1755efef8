"""Run folders as the commands that write them number them: `base`, then `base-2`, `base-3`, ...
(like PyTorch Lightning's `version_N`), a folder counting once something besides its run lock is
in it. `minite train` (rl/train/run_dir.py) and `minite diagnose` (rl/diagnostics/gap_report.py)
both pick their next folder from here."""

from __future__ import annotations

import re
from pathlib import Path

# the lock `minite train` holds in its run folder (rl/train/run_dir.py): not a sign of a run
LOCK_NAME = ".minite-run.lock"


def holds_a_run(folder: Path) -> bool:
    """A folder a run has written to: it exists and holds something besides the run lock."""
    return folder.is_dir() and any(p.name != LOCK_NAME for p in folder.iterdir())


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
