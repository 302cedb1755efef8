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


def profile_call(fn, wall_ms: float, top: int = 20) -> dict:
    """One call of `fn` under torch.profiler: GPU busy time (sum of kernel time) vs the call's
    wall time measured without the profiler (a host-bound call has a low ratio), the kernels
    with the most GPU time, and the operators with the most CPU time (fp4_compile:: ops include
    their host-side work)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.key_averages()

    def dev_us(e):
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)

    kernels = [e for e in events if dev_us(e) > 0]
    busy_ms = sum(dev_us(e) for e in kernels) / 1e3
    by_gpu = sorted(kernels, key=dev_us, reverse=True)[:top]
    ops = [e for e in events if e.key.startswith(("fp4_compile::", "aten::", "Optimizer"))]
    by_cpu = sorted(ops, key=lambda e: e.cpu_time_total, reverse=True)[:top]
    return {
        "gpu_busy_ms": busy_ms,
        "wall_ms": wall_ms,
        "gpu_busy_frac": busy_ms / wall_ms if wall_ms else None,
        "top_gpu": [{"name": e.key[:90], "ms": dev_us(e) / 1e3, "calls": e.count} for e in by_gpu],
        "top_cpu_ops": [
            {"name": e.key[:90], "cpu_total_ms": e.cpu_time_total / 1e3, "calls": e.count}
            for e in by_cpu
        ],
    }


def profile_markdown(label: str, prof: dict, what: str) -> list[str]:
    """The markdown section of one `profile_call` result."""
    return [
        "",
        f"## where the time goes: {label}",
        f"GPU busy {prof['gpu_busy_ms']:.1f} ms of a {prof['wall_ms']:.1f} ms {what} "
        f"({100 * prof['gpu_busy_frac']:.0f}%; below 100%: host time, launches and syncs)",
        "",
        "| GPU kernel | ms | calls |",
        "| --- | --- | --- |",
        *[f"| `{k['name']}` | {k['ms']:.2f} | {k['calls']} |" for k in prof["top_gpu"]],
        "",
        "| operator (CPU time incl. children) | ms | calls |",
        "| --- | --- | --- |",
        *[
            f"| `{k['name']}` | {k['cpu_total_ms']:.2f} | {k['calls']} |"
            for k in prof["top_cpu_ops"]
        ],
    ]
