"""Shared benchmark plumbing: environment record, timing, result files."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import torch


def environment() -> dict:
    env = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "absent"
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        major, minor = torch.cuda.get_device_capability()
        env["capability"] = f"sm_{major}{minor}"
    else:
        env["gpu"] = "none (CPU)"
    if os.environ.get("MINITE_COMMIT"):  # the device copy has no git metadata
        env["commit"] = os.environ["MINITE_COMMIT"]
        return env
    try:
        env["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        env["commit"] = "unknown"
    return env


def cuda_time_ms(fn, *, warmup: int = 3, iters: int = 10) -> float:
    """Median wall time per call in ms with CUDA events (CPU: perf_counter)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def write_results(name: str, payload: dict, markdown: str) -> list[Path]:
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{payload['env']['date']}_{name}"
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(payload, indent=1, default=str))
    paths[1].write_text(markdown)
    return paths
