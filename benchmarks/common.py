"""Shared benchmark plumbing: environment record, timing, result files."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import torch


def median_ms(fn) -> float:
    """`triton.testing.do_bench` median of fn, in ms (the offline tuners' timer)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


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


def run_train(
    recipe: str,
    variant: str,
    work: Path,
    overrides: list[str],
    timeout_s: float,
    run_dir: Path | None = None,
):
    """`minite train RECIPE --variant V` (fresh, into `run_dir`, default work/RECIPE-V, cache
    work/cache) with a wall-clock limit: (return code or "timeout", its output, wall seconds,
    its run folder)."""
    import sys

    run_dir = run_dir if run_dir is not None else work / f"{recipe}-{variant}"
    cmd = [
        sys.executable,
        "-m",
        "fp4_compile.cli",
        "train",
        recipe,
        "--variant",
        variant,
        "--fresh",
        "--no-progress",
        f"out_dir={run_dir}",
        f"cache_dir={work / 'cache'}",
        *overrides,
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        partial = e.stdout or ""  # bytes even with text=True
        rc = "timeout"
        log = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
    return rc, log, time.perf_counter() - t0, run_dir


def median(xs: list[float]) -> float:
    """The upper median (an element of xs), NaN for none."""
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def result_stem(topic: str, env: dict) -> str:
    """`<date>_<topic>_<commit>` (commit: 7 hex digits), the name of every result file under
    benchmarks/results/ (the index, benchmarks/results/README.md, keeps the latest per topic)."""
    commit = str(env.get("commit") or "unknown")[:7]
    return f"{env['date']}_{topic}_{commit}"


def write_results(name: str, payload: dict, markdown: str) -> list[Path]:
    """`payload` (with its `env`, from `environment()`) as json and `markdown` as md, named by
    `result_stem`, under $OUT (default benchmarks/results/)."""
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(name, payload["env"])
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(payload, indent=1, default=str))
    paths[1].write_text(markdown)
    return paths


def is_annotation(key: str) -> bool:
    """A user annotation that the profiler also puts on the GPU timeline ("Optimizer.step#AdamW
    .step", "## Call CompiledFxGraph ... ##", "ProfilerStep#3"), not a kernel. Kernel names may
    hold '#' too (ATen's "{lambda()#3}"), always with a parenthesis: before 2026-12-03 (26e5bec)
    every such kernel was dropped here, and "GPU busy" undercounted (minite's CUDA-graph learner
    step: 32.9 ms reported, 37.9 ms of kernels in its trace)."""
    if key.startswith(("ProfilerStep", "Optimizer.", "## ")):
        return True
    return "#" in key and "(" not in key


def profile_call(fn, wall_ms: float, top: int = 20) -> dict:
    """One call of `fn` under torch.profiler: GPU busy time (sum of kernel time) vs the call's
    wall time measured without the profiler (a host-bound call has a low ratio), the kernels
    with the most GPU time (`top` for the tables, up to 400 with their class in `gpu_kernels`), and the operators with the most CPU time (fp4_compile:: ops include
    their host-side work)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    launches = kernel_launches(prof)

    def dev_us(e):
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)

    # kernels and memcpys only: CPU operators also carry the device time of what they launched
    # (counting both would count every kernel twice)
    kernels = [
        e
        for e in events
        if str(e.device_type).endswith("CUDA") and dev_us(e) > 0 and not is_annotation(e.key)
    ]
    busy_ms = sum(dev_us(e) for e in kernels) / 1e3
    classes: dict[str, list[float]] = {}
    for e in kernels:
        c = classes.setdefault(kernel_class(e.key), [0.0, 0])
        c[0] += dev_us(e) / 1e3
        c[1] += e.count
    by_gpu = sorted(kernels, key=dev_us, reverse=True)[:top]
    ops = [e for e in events if e.key.startswith(("fp4_compile::", "aten::", "Optimizer"))]

    def dev_total_us(e):
        return getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)

    minite_ops = sorted(
        (e for e in events if e.key.startswith("fp4_compile::") and dev_total_us(e) > 0),
        key=dev_total_us,
        reverse=True,
    )
    by_cpu = sorted(ops, key=lambda e: e.cpu_time_total, reverse=True)[:top]
    return {
        "gpu_busy_ms": busy_ms,
        "wall_ms": wall_ms,
        "gpu_busy_frac": busy_ms / wall_ms if wall_ms else None,
        "by_class": [
            {"class": k, "ms": v[0], "calls": v[1]}
            for k, v in sorted(classes.items(), key=lambda kv: -kv[1][0])
        ],
        "top_gpu": [{"name": e.key[:90], "ms": dev_us(e) / 1e3, "calls": e.count} for e in by_gpu],
        # the longer list behind the table, in the JSON only (where the small kernels go)
        "gpu_kernels": [
            {
                "name": e.key[:120],
                "class": kernel_class(e.key),
                "ms": dev_us(e) / 1e3,
                "calls": e.count,
            }
            for e in sorted(kernels, key=dev_us, reverse=True)[:400]
        ],
        "gpu_by_minite_op": [
            {"name": e.key[:90], "gpu_ms": dev_total_us(e) / 1e3, "calls": e.count}
            for e in minite_ops
        ],
        "top_cpu_ops": [
            {"name": e.key[:90], "cpu_total_ms": e.cpu_time_total / 1e3, "calls": e.count}
            for e in by_cpu
        ],
        # each launch of the Triton kernels by its grid (the same kernel at different shapes)
        "kernels_by_grid": kernels_by_grid(launches),
    }


def kernel_launches(prof) -> list[dict]:
    """Every kernel of a profile in launch order: {name, grid, us} (the grid from the trace's
    kernel events; empty where the profiler did not record it)."""
    import json
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") == "kernel" and "dur" in ev:
            grid = ev.get("args", {}).get("grid", [])
            out.append(
                {
                    "name": ev.get("name", "")[:120],
                    "grid": list(grid),
                    "ts": ev.get("ts", 0),
                    "us": float(ev["dur"]),
                }
            )
    out.sort(key=lambda e: e["ts"])
    return out


def kernels_by_grid(launches: list[dict], prefix: str = "_") -> list[dict]:
    """Launches of the kernels whose name starts with `prefix` (minite's Triton kernels), summed
    by (name, grid): which shape of a kernel takes the time. Largest first."""
    acc: dict[tuple, list[float]] = {}
    for e in launches:
        if e["name"].startswith(prefix):
            a = acc.setdefault((e["name"], tuple(e["grid"])), [0.0, 0])
            a[0] += e["us"]
            a[1] += 1
    rows = [{"name": k[0], "grid": list(k[1]), "us": v[0], "calls": v[1]} for k, v in acc.items()]
    return sorted(rows, key=lambda r: -r["us"])


_KERNEL_CLASSES = (  # (class, substrings of kernel names), first match wins
    (
        "NVFP4 quantize / dequantize",
        ("_quantize_kernel", "_row_global_kernel", "_dequant", "ongrid"),
    ),
    ("NVFP4 GEMM (Triton)", ("_nvfp4_gemm_kernel", "_grouped_wgrad_kernel")),
    ("invariant BF16 GEMM (Triton)", ("_linear_kernel", "_grouped_linear")),
    ("attention", ("attention", "_attn", "flash", "sdpa", "fmha")),
    ("cuBLAS/CUTLASS GEMM", ("gemm", "cutlass", "xmma", "sm90_", "Kernel2")),
    ("optimizer", ("multi_tensor_apply", "adam")),
    ("copies", ("copy", "Memcpy", "Memset", "cat", "index", "scatter", "gather")),
    ("norms, logprobs, routing", ("rms", "logprob", "routing", "sort", "topk")),
    ("reductions", ("reduce", "sum", "amax", "max")),
    ("Inductor-fused elementwise", ("triton_poi", "triton_per", "triton_red")),
)


def kernel_class(name: str) -> str:
    """The op class of a GPU kernel, for the breakdown tables (name substrings; 'other' else)."""
    low = name.lower()
    for cls, keys in _KERNEL_CLASSES:
        if any(k.lower() in low for k in keys):
            return cls
    return "other elementwise"


def profile_markdown(label: str, prof: dict, what: str) -> list[str]:
    """The markdown section of one `profile_call` result."""
    return [
        "",
        f"## where the time goes: {label}",
        f"GPU busy {prof['gpu_busy_ms']:.1f} ms of a {prof['wall_ms']:.1f} ms {what} "
        f"({100 * prof['gpu_busy_frac']:.0f}%; below 100%: host time, launches and syncs)",
        "",
        "| op class (GPU kernels) | ms | calls |",
        "| --- | --- | --- |",
        *[f"| {c['class']} | {c['ms']:.2f} | {c['calls']} |" for c in prof.get("by_class", [])],
        "",
        "| GPU kernel | ms | calls |",
        "| --- | --- | --- |",
        *[f"| `{k['name']}` | {k['ms']:.2f} | {k['calls']} |" for k in prof["top_gpu"]],
        "",
        "| fp4_compile op (GPU time of the kernels it launched, nested ops included) | ms | calls |",
        "| --- | --- | --- |",
        *[
            f"| `{k['name']}` | {k['gpu_ms']:.2f} | {k['calls']} |"
            for k in prof.get("gpu_by_minite_op", [])
        ],
        "",
        "| Triton kernel by grid | grid | us | calls |",
        "| --- | --- | --- | --- |",
        *[
            f"| `{k['name']}` | {k['grid']} | {k['us']:.1f} | {k['calls']} |"
            for k in prof.get("kernels_by_grid", [])[:40]
        ],
        "",
        "| operator (CPU time incl. children) | ms | calls |",
        "| --- | --- | --- |",
        *[
            f"| `{k['name']}` | {k['cpu_total_ms']:.2f} | {k['calls']} |"
            for k in prof["top_cpu_ops"]
        ],
    ]


# ---- kernel timing (`benchmarks.gemm`, `.grouped_gemm`, `.quantize`, `.decode_gemm`) ----------
#
# Two figures per call, both medians of `triton.testing`:
# - `launch_ms`: the call as the learner and the rollout make it (eager launches, `do_bench`). When
#   the host takes longer to launch the work than the GPU takes to run it, this is host time.
# - `graph_ms`: the same work replayed from a CUDA graph (`do_bench_cudagraph`): GPU time only.
# launch_ms >> graph_ms says the call is launch-bound, not kernel-bound: the measured limiter.

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
    lines = [
        f"# {title}, {env['gpu']} ({LABEL})",
        "",
        f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}, {env['date']}.",
        "ms are medians; `launch` = eager launches as the ops run them, `graph` = the same "
        "work replayed from a CUDA graph (GPU time only); ratio = baseline / ours, > 1 is "
        "faster. Baselines measured in the same run.",
        "",
    ]
    return env, lines


def module_index(package: str) -> str:
    """`python -m benchmarks` / `python -m tools`: one line per module of the folder `package`,
    its name and the first sentence of its docstring (read from the source, nothing imported),
    runnable modules (with a `__main__` block) first; helpers are marked."""
    import ast
    import re

    folder = Path(__file__).resolve().parent.parent / package
    runnable, helpers = [], []
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        source = path.read_text()
        doc = ast.get_docstring(ast.parse(source)) or ""
        paragraph = " ".join(doc.split("\n\n")[0].split())
        first = re.split(r"(?<=[.?!])\s", paragraph, maxsplit=1)[0]
        if len(first) > 110:
            first = first[:107].rsplit(" ", 1)[0] + " ..."
        main = re.search(r"^if __name__ == .__main__.:", source, re.MULTILINE)
        (runnable if main else helpers).append((path.stem, first))
    width = max(len(name) for name, _ in runnable + helpers)
    lines = [f"python -m {package}.<name>:"]
    lines += [f"  {name.ljust(width)}  {first}" for name, first in runnable]
    if helpers:
        lines.append("helpers (imported by the above, not run):")
        lines += [f"  {name.ljust(width)}  {first}" for name, first in helpers]
    return "\n".join(lines)
