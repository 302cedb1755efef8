"""Ctrl-C in `minite train`: the first one stops the run after the step in progress, with a
checkpoint, the summary and the plots of the steps done; a second one stops at once (the steps
since the last checkpoint are then redone by `--resume`). Either way the user is told how to
continue (`resume_command`)."""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import threading
from collections.abc import Iterator


class StopOnInterrupt:
    """`train(cfg, stop=StopOnInterrupt())`: true once Ctrl-C was pressed (while `installed`)."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self) -> bool:
        return self.requested

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopOnInterrupt]:
        """SIGINT handled as above for the duration (the main thread only; elsewhere the
        default stays: Python can install handlers only there)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum, frame):
            if self.requested:  # the second Ctrl-C: at once
                signal.signal(signal.SIGINT, previous)
                raise KeyboardInterrupt
            self.requested = True
            print(
                "\nminite: Ctrl-C: stopping after the step in progress (checkpoint, summary and "
                "plots are written); press Ctrl-C again to stop at once",
                file=sys.stderr,
                flush=True,
            )

        signal.signal(signal.SIGINT, handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


def resume_command(preset: str, variant: str, overrides: list[str], out_dir: str) -> str:
    """The `minite train` command that continues this run: its settings, its folder, --resume."""
    kept = [o for o in overrides if o.partition("=")[0].strip().replace("-", "_") != "out_dir"]
    parts = [
        "minite",
        "train",
        preset,
        "--variant",
        variant,
        *kept,
        f"out_dir={out_dir}",
        "--resume",
    ]
    return " ".join(shlex.quote(p) for p in parts)
