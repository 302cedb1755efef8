"""NVFP4 quantize (`fp4_compile::quantize` kernels) vs device-to-device copy bandwidth, same run.

    python -m benchmarks.quantize

Bytes counted for the quantizer: the input read plus the output written (packed codes + E4M3
scales, the on-grid BF16 tensor the GEMMs consume, or both). Rows: activations / gradients
[M, K], then the learner's MoE weights [E, N, K] (16x16 tiles, per-expert scales). The copy baseline (`clone`) reads and
writes the input once. Launch and CUDA-graph figures as in `benchmarks.common`.
"""

from __future__ import annotations

import torch

from benchmarks.common import both, fmt, header, write_results

SHAPES = ((4096, 2048), (32768, 2048), (8192, 8192))
# The learner's per-step weight quantize (the Qwen3-30B-A3B-shaped MoE experts: gate_up, down),
# 16x16 tiles, one global scale per expert, in the three output forms: what writing the packed
# bytes next to the on-grid copy costs (the learner's GEMMs read only the copy at >= 256 rows
# per expert: `nvfp4_impl.ONGRID_FORWARD_MIN_ROWS`).
WEIGHT_SHAPES = ((128, 1536, 2048), (128, 2048, 768))
WEIGHT_OUTS = ("packed", "both", "ongrid")
MODES = (
    ("per_row", "rne", "packed"),
    ("per_row", "rne", "ongrid"),
    ("per_tensor", "stochastic", "ongrid"),
)


# bytes written per input element, by output form (packed: E2M1 nibble + an E4M3 byte per 16)
OUT_BYTES = {"packed": 0.5 + 1 / 16, "ongrid": 2, "both": 2.5 + 1 / 16}


def _timed_rows(x, cases) -> list[dict]:
    """One row per (fields, out, run) case: its launch / graph times against a copy of x."""
    copy = both(lambda: x.clone())
    copy_bytes = 2 * x.numel() * 2
    rows = []
    for fields, out, run in cases:
        t = both(run)
        q_bytes = x.numel() * (2 + OUT_BYTES[out])
        row = {**fields, "out": out, "copy_ms": copy, "quantize_ms": t}
        for i, how in enumerate(("launch", "graph")):
            c, q = copy[i], t[i]
            row[f"copy_GBps_{how}"] = None if not c else copy_bytes / c / 1e6
            row[f"quantize_GBps_{how}"] = None if not q else q_bytes / q / 1e6
            row[f"fraction_{how}"] = (
                None if not (c and q) else row[f"quantize_GBps_{how}"] / row[f"copy_GBps_{how}"]
            )
        print(row, flush=True)
        rows.append(row)
    return rows


def measure(m, k) -> list[dict]:
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    cases = [
        (
            {"M": m, "K": k, "global_scale": gs, "rounding": rounding},
            out,
            lambda gs=gs, rounding=rounding, out=out: quantize_triton(
                x,
                global_scale=gs,
                rounding=rounding,
                out=out,
                seed=7 if rounding == "stochastic" else None,
            ),
        )
        for gs, rounding, out in MODES
    ]
    return _timed_rows(x, cases)


def measure_weight(e, n, k) -> list[dict]:
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
    fields = {"M": f"{e}x{n}", "K": k, "global_scale": "per_expert 16x16", "rounding": "rne"}
    cases = [
        (
            fields,
            out,
            lambda out=out: quantize_triton(w, block="16x16", global_scale="per_expert", out=out),
        )
        for out in WEIGHT_OUTS
    ]
    return _timed_rows(w, cases)


def markdown(lines, rows) -> str:
    lines += [
        "| M | K | global scale | rounding | out | copy GB/s (graph) | quantize ms launch / "
        "graph | quantize GB/s launch / graph | fraction of copy launch / graph |",
        "| --- " * 9 + "|",
    ]
    for r in rows:
        q = r["quantize_ms"]
        lines.append(
            f"| {r['M']} | {r['K']} | {r['global_scale']} | {r['rounding']} | {r['out']} | "
            f"{fmt(r['copy_GBps_graph'], '.0f')} | {fmt(q[0])} / {fmt(q[1])} | "
            f"{fmt(r['quantize_GBps_launch'], '.0f')} / {fmt(r['quantize_GBps_graph'], '.0f')} | "
            f"{fmt(r['fraction_launch'], '.2f')} / {fmt(r['fraction_graph'], '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    env, lines = header("NVFP4 quantize vs device copy")
    rows = [r for m, k in SHAPES for r in measure(m, k)]
    rows += [r for e, n, k in WEIGHT_SHAPES for r in measure_weight(e, n, k)]
    for path in write_results("quantize", {"env": env, "rows": rows}, markdown(lines, rows)):
        print("wrote", path)


if __name__ == "__main__":
    main()
