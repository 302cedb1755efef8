"""Where a learner step's GPU sits idle: one profiled step (torch.profiler chrome trace), the gaps
between consecutive GPU kernels bucketed by length, the largest gaps with the kernels around
them and the CPU operators running meanwhile. For the CUDA-graph learner, whose step is not
host-launch-bound, yet GPU busy is ~84% (minite) vs ~91% (Inductor BF16) with 805 vs 281
kernels per step (`2026-12-03_learner_3c3015c.md`). Figures: emulated NVFP4 (sm_90).

    python -m tools.learner_gaps [--layers 2] [--batch 8] [--seq 512] [--no-cuda-graphs]
    python -m tools.learner_gaps --from-trace TRACE.json.gz   # attribution of a kept trace

With --no-cuda-graphs the kernels are launched one by one from the host, so each can be traced
back to the operator that launched it: the report then also attributes every kernel's GPU time
to the outermost `fp4_compile::` op around its launch (which op's own ATen glue costs what).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from pathlib import Path

import torch

from benchmarks.common import environment, write_results
from benchmarks.learner import step_fn
from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers

BUCKETS_US = (2.0, 5.0, 20.0, 100.0, float("inf"))


def gap_summary(events: list[dict], top: int = 25) -> dict:
    """From chrome-trace events (ts / dur in us): GPU kernels' busy time, the span from the first
    kernel start to the last kernel end, the gaps between consecutive kernels (count and sum per
    length bucket), and the `top` largest gaps with their neighbours and the CPU operators that
    overlap them."""
    kernels = sorted(
        (e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: e["ts"]
    )
    cpu = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime") and "dur" in e]
    if not kernels:
        return {"kernels": 0}
    busy = sum(k["dur"] for k in kernels)
    span = max(k["ts"] + k["dur"] for k in kernels) - kernels[0]["ts"]
    gaps = []
    end = kernels[0]["ts"] + kernels[0]["dur"]
    prev = kernels[0]
    for k in kernels[1:]:
        if k["ts"] > end:
            gaps.append((k["ts"] - end, end, prev["name"], k["name"]))
        if k["ts"] + k["dur"] > end:
            end, prev = k["ts"] + k["dur"], k
    buckets = []
    lo = 0.0
    for hi in BUCKETS_US:
        sel = [g[0] for g in gaps if lo <= g[0] < hi]
        buckets.append({"from_us": lo, "to_us": hi, "count": len(sel), "sum_ms": sum(sel) / 1e3})
        lo = hi
    largest = []
    for length, start, before, after in sorted(gaps, reverse=True)[:top]:
        stop = start + length
        during = sorted({c["name"] for c in cpu if c["ts"] < stop and c["ts"] + c["dur"] > start})[
            :8
        ]
        largest.append(
            {
                "gap_us": length,
                "after_kernel": before[:80],
                "before_kernel": after[:80],
                "cpu_ops_meanwhile": during,
            }
        )
    return {
        "kernels": len(kernels),
        "busy_ms": busy / 1e3,
        "span_ms": span / 1e3,
        "gaps": len(gaps),
        "gap_ms": sum(g[0] for g in gaps) / 1e3,
        "buckets": buckets,
        "largest": largest,
    }


def attribute_kernels(events: list[dict], top: int = 40) -> dict:
    """Kernel GPU time by the outermost `fp4_compile::` CPU op around each kernel's launch (the
    launch's correlation id links it to its runtime or driver call (Triton launches through the
    driver API); the op is the widest `fp4_compile::`
    cpu_op on that thread whose interval holds the call), "(none)" outside any; per op: GPU
    ms, kernels, and how much of that is stock ATen / cub (not Triton) kernels; and the
    `top` (op, kernel) pairs. Launches inside a CUDA-graph replay cannot be attributed."""
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    ops_by_tid: dict = {}
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("name", "").startswith("fp4_compile::"):
            ops_by_tid.setdefault(e.get("tid"), []).append(e)
    per_op: dict = {}
    pairs: dict = {}
    for k in events:
        if k.get("cat") != "kernel" or "dur" not in k:
            continue
        launch = launches.get(k.get("args", {}).get("correlation"))
        owner = "(none)"
        if launch is not None:
            around = [
                o
                for o in ops_by_tid.get(launch.get("tid"), [])
                if o["ts"] <= launch["ts"] <= o["ts"] + o["dur"]
            ]
            if around:
                owner = max(around, key=lambda o: o["dur"])["name"]
        stock = not _is_triton(k["name"])
        row = per_op.setdefault(
            owner, {"op": owner, "gpu_ms": 0.0, "kernels": 0, "stock_ms": 0.0, "stock_kernels": 0}
        )
        row["gpu_ms"] += k["dur"] / 1e3
        row["kernels"] += 1
        if stock:
            row["stock_ms"] += k["dur"] / 1e3
            row["stock_kernels"] += 1
        pair = pairs.setdefault(
            (owner, k["name"][:90]), {"op": owner, "kernel": k["name"][:90], "ms": 0.0, "calls": 0}
        )
        pair["ms"] += k["dur"] / 1e3
        pair["calls"] += 1
    return {
        "by_op": sorted(per_op.values(), key=lambda r: -r["gpu_ms"]),
        "top_pairs": sorted(pairs.values(), key=lambda r: -r["ms"])[:top],
    }


def attribution_markdown(att: dict) -> list[str]:
    """The markdown tables of an `attribute_kernels` result."""
    return [
        "### kernel time by the fp4_compile op that launched it",
        "",
        "| op | GPU ms | kernels | of which stock ATen/cub ms | stock kernels |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| `{o['op']}` | {o['gpu_ms']:.2f} | {o['kernels']} | {o['stock_ms']:.2f} | "
            f"{o['stock_kernels']} |"
            for o in att["by_op"]
        ),
        "",
        "| op | kernel | ms | calls |",
        "| --- | --- | --- | --- |",
        *(
            f"| `{p['op']}` | `{p['kernel']}` | {p['ms']:.3f} | {p['calls']} |"
            for p in att["top_pairs"]
        ),
        "",
    ]


def _read_trace(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _is_triton(name: str) -> bool:
    """Triton kernels (minite's `_..._kernel`, Inductor's `triton_...`) vs stock ATen / cub /
    cuBLAS kernels (C++ names: templates, namespaces)."""
    return "::" not in name and "<" not in name and "(" not in name


def _trace_step(step, path: Path) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--from-trace", help="only attribute the kernels of this chrome trace")
    args = parser.parse_args()
    if args.from_trace:
        print("\n".join(attribution_markdown(attribute_kernels(_read_trace(args.from_trace)))))
        return
    env = environment()
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    ids = torch.randint(0, 8192, (args.batch, args.seq), device="cuda")
    graphs = not args.no_cuda_graphs
    configs = [
        ("inductor BF16", "inductor", None),
        ("minite strict", "minite", {"recipe": NVFP4Recipe.strict(), "cuda_graphs": graphs}),
    ]
    rows = []
    for label, backend, options in configs:
        torch._dynamo.reset()
        model = qwen3_30b_a3b_layers(layers=args.layers, device="cuda")
        kw = {"options": options} if options else {}
        if backend == "inductor" and graphs:
            kw["mode"] = "reduce-overhead"
        compiled = torch.compile(model, backend=backend, **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
        step = step_fn(compiled, ids, opt)
        try:
            for _ in range(4):
                step()
            torch.cuda.synchronize()
            trace = out / f"trace_{backend}.json"
            events = _trace_step(step, trace)
            row = {"label": label, **gap_summary(events)}
            if not graphs and backend == "minite":
                row["attribution"] = attribute_kernels(events)
            with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
                dst.write(src.read())
            trace.unlink()
        except Exception as e:  # recorded, not hidden
            row = {"label": label, "error": f"{type(e).__name__}: {e}"[:1500]}
        print(json.dumps(row)[:3000], flush=True)
        rows.append(row)
        del model, compiled, opt
        torch.cuda.empty_cache()
    md = [
        f"# learner step: GPU idle gaps, {env['gpu']} (emulated NVFP4, sm_90), torch "
        f"{env['torch']}, triton {env['triton']}, commit {env['commit']}",
        f"Qwen3-30B-A3B-shaped, {args.layers} layers, {args.batch}x{args.seq} tokens, "
        f"fwd+bwd+AdamW, CUDA graphs: {graphs}; one profiled step after 4 warm-up steps",
        "",
    ]
    for r in rows:
        if "error" in r or not r.get("kernels"):
            md.append(f"## {r['label']}: {r.get('error', 'no kernels')}")
            continue
        md += [
            f"## {r['label']}: {r['kernels']} kernels, busy {r['busy_ms']:.2f} ms of a "
            f"{r['span_ms']:.2f} ms kernel span, {r['gaps']} gaps = {r['gap_ms']:.2f} ms",
            "",
            "| gap length (us) | count | sum ms |",
            "| --- | --- | --- |",
            *(
                f"| {b['from_us']:g}-{b['to_us']:g} | {b['count']} | {b['sum_ms']:.2f} |"
                for b in r["buckets"]
            ),
            "",
            "| gap us | after kernel | before kernel | CPU ops meanwhile |",
            "| --- | --- | --- | --- |",
            *(
                f"| {g['gap_us']:.0f} | `{g['after_kernel']}` | `{g['before_kernel']}` | "
                f"{', '.join(g['cpu_ops_meanwhile'])} |"
                for g in r["largest"]
            ),
            "",
        ]
        if "attribution" in r:
            md += attribution_markdown(r["attribution"])
    text = "\n".join(md) + "\n"
    print(text)
    write_results("learner_gaps", {"env": env, "args": vars(args), "rows": rows}, text)


if __name__ == "__main__":
    main()
