"""Timing plumbing of the kernel benchmarks (`benchmarks.gemm`, `.grouped_gemm`, `.quantize`).

Two figures per call, both medians of `triton.testing`:
- `launch_ms`: the call as the learner and the rollout make it (eager launches, `do_bench`). When
  the host takes longer to launch the work than the GPU takes to run it, this is host time.
- `graph_ms`: the same work replayed from a CUDA graph (`do_bench_cudagraph`): GPU time only.
launch_ms >> graph_ms says the call is launch-bound, not kernel-bound: the measured limiter.
"""

from __future__ import annotations

import torch

from benchmarks.common import environment

LABEL = "emulated NVFP4 (sm_90)"


def launch_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graph_ms(fn) -> float | None:
    """GPU time of `fn` from a CUDA graph replay, or None where the call cannot be captured."""
    import triton.testing

    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
    except Exception as exc:  # recorded as absent, with the reason printed
        print(f"CUDA graph capture failed ({type(exc).__name__}: {str(exc)[:120]})", flush=True)
        torch.cuda.synchronize()
        return None


def both(fn) -> tuple[float, float | None]:
    return launch_ms(fn), graph_ms(fn)


def fmt(v: float | None, spec: str = ".4f") -> str:
    return "n/a" if v is None else format(v, spec)


def ratio(base: float | None, ours: float | None) -> float | None:
    return None if base is None or not ours else base / ours


def header(title: str) -> tuple[dict, list[str]]:
    """The environment record and the first markdown lines of a kernel benchmark."""
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU")
    env = environment()
    lines = [f"# {title}, {env['gpu']} ({LABEL})", "",
             f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}, {env['date']}.",
             "ms are medians; `launch` = eager launches as the ops run them, `graph` = the same "
             "work replayed from a CUDA graph (GPU time only); ratio = baseline / ours, > 1 is "
             "faster. Baselines measured in the same run.", ""]  # fmt: skip
    return env, lines
