"""The first step's compilation is not silent: `Heartbeat` (rl/train/run_log.py), which `train`
wraps around the first step, logs a "still compiling (N s)" line every `every_s` seconds while
its block runs and none after it ends."""

import time

import pytest

from fp4_compile.rl.train.run_log import Heartbeat


def test_heartbeat_logs_while_the_block_runs():
    lines = []
    with Heartbeat(lines.append, every_s=0.05):
        time.sleep(0.3)
    n = len(lines)
    assert n >= 2, lines
    assert all(line.startswith("  ... still compiling (") for line in lines), lines
    time.sleep(0.15)
    assert len(lines) == n  # stopped with the block


def test_heartbeat_stops_when_the_block_raises():
    lines = []
    with pytest.raises(RuntimeError), Heartbeat(lines.append, every_s=0.05):
        raise RuntimeError("boom")
    time.sleep(0.15)
    assert lines == []
    with pytest.raises(ValueError, match="every_s"):
        Heartbeat(print, every_s=0)
