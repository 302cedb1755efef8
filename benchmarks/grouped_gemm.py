# ruff: noqa: B023  (each benchmarked closure is timed immediately, inside its own iteration)
"""NVFP4 MoE grouped GEMM (`fp4_compile::nvfp4_grouped_mm`, one launch for all experts) and the
one-pass MoE wgrad vs `torch._grouped_mm` BF16, same run.

    python -m benchmarks.grouped_gemm [--quick]

Qwen3-30B-A3B experts: 128 experts, gate_up [128, 1536, 2048] and down [128, 2048, 768], balanced
routing at 8 to 1024 tokens per expert. Forward: the op with packed weights and with the on-grid
BF16 copy. Backward weight gradient (dW_e = dY_e^T X_e, NVFP4 with stochastic rounding):
`grouped_wgrad` vs the per-expert loop it replaced and vs BF16 `torch._grouped_mm` over token
segments. Figures: "emulated NVFP4 (sm_90)".
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import both, fmt, header, launch_ms, ratio, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.nvfp4 import gemm as impl

EXPERTS = {"gate_up": (128, 1536, 2048), "down": (128, 2048, 768)}
PER_EXPERT = (8, 64, 128, 256, 512, 1024)


def _offsets(e, per):
    return (torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * per).to(torch.int32)


def forward_row(name, e, n, k, per, recipe) -> dict:
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
    wq = quantize_triton(w, block="16x16", global_scale="per_expert")
    w_og = wq.on_grid(torch.bfloat16)
    codes, sc, gd = wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode
    offsets = _offsets(e, per)
    x = torch.randn(e * per, k, device="cuda", dtype=torch.bfloat16)
    w_kn = w.transpose(-1, -2)
    row = {"kind": "forward", "name": name, "E": e, "N": n, "K": k, "per_expert": per}
    row["bf16_grouped_mm"] = both(lambda: torch._grouped_mm(x, w_kn, offs=offsets))
    row["op_packed"] = both(
        lambda: impl.cuda_linear(x, codes, sc, gd, None, None, recipe, None, offsets=offsets)
    )
    row["op_ongrid"] = both(
        lambda: impl.cuda_linear(x, codes, sc, gd, w_og, None, recipe, None, offsets=offsets)
    )
    g = row["op_packed"][1]
    row["packed_weight_GBps"] = None if not g else e * n * k * (0.5 + 1 / 16) / g / 1e6
    print(row, flush=True)
    return row


def wgrad_row(name, e, n, k, per, recipe, with_loop: bool) -> dict:
    from fp4_compile.codegen.nvfp4.grouped_wgrad_kernel import grouped_wgrad

    offsets = _offsets(e, per)
    dy = torch.randn(e * per, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(e * per, k, device="cuda", dtype=torch.bfloat16)
    row = {"kind": "wgrad", "name": name, "E": e, "N": n, "K": k, "per_expert": per}
    dyt = dy.t().contiguous()
    try:
        row["bf16_grouped_mm"] = both(lambda: torch._grouped_mm(dyt, x, offs=offsets))
    except Exception as exc:
        print("bf16 wgrad baseline unavailable:", exc, flush=True)
        row["bf16_grouped_mm"] = (None, None)
    row["grouped_wgrad"] = both(lambda: grouped_wgrad(dy, x, offsets, recipe, 4096))

    def loop():
        for i in range(e):
            impl.cuda_wgrad(dy[i * per : (i + 1) * per], x[i * per : (i + 1) * per], recipe, i)

    row["per_expert_loop_launch_ms"] = launch_ms(loop) if with_loop else None
    print(row, flush=True)
    return row


def markdown(lines, rows) -> str:
    lines += [
        "## Forward (x [T, K] sorted by expert -> [T, N])",
        "",
        "| experts | tokens/expert | BF16 grouped_mm launch / graph | op packed launch / graph "
        "| op on-grid launch / graph | ratio packed (graph) | ratio on-grid (graph) | packed "
        "weight GB/s |",
        "| --- " * 8 + "|",
    ]
    for r in (r for r in rows if r["kind"] == "forward"):
        b, p, o = r["bf16_grouped_mm"], r["op_packed"], r["op_ongrid"]
        lines.append(
            f"| {r['name']} [{r['E']},{r['N']},{r['K']}] | {r['per_expert']} | "
            f"{fmt(b[0])} / {fmt(b[1])} | {fmt(p[0])} / {fmt(p[1])} | {fmt(o[0])} / "
            f"{fmt(o[1])} | {fmt(ratio(b[1], p[1]), '.2f')} | {fmt(ratio(b[1], o[1]), '.2f')} "
            f"| {fmt(r['packed_weight_GBps'], '.0f')} |"
        )
    lines += [
        "",
        "## Weight gradient (dW [E, N, K] from dY [T, N], X [T, K])",
        "",
        "| experts | tokens/expert | BF16 grouped_mm launch / graph | NVFP4 grouped_wgrad "
        "launch / graph | ratio (graph) | per-expert loop (before) launch |",
        "| --- " * 6 + "|",
    ]
    for r in (r for r in rows if r["kind"] == "wgrad"):
        b, g = r["bf16_grouped_mm"], r["grouped_wgrad"]
        lines.append(
            f"| {r['name']} [{r['E']},{r['N']},{r['K']}] | {r['per_expert']} | "
            f"{fmt(b[0])} / {fmt(b[1])} | {fmt(g[0])} / {fmt(g[1])} | "
            f"{fmt(ratio(b[1], g[1]), '.2f')} | {fmt(r['per_expert_loop_launch_ms'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="gate_up at 64 tokens/expert only")
    args = parser.parse_args()
    env, lines = header("NVFP4 MoE grouped GEMM vs torch._grouped_mm BF16")
    recipe = NVFP4Recipe.strict()
    rows = []
    for name, (e, n, k) in EXPERTS.items():
        for per in (64,) if args.quick else PER_EXPERT:
            rows.append(forward_row(name, e, n, k, per, recipe))
            rows.append(wgrad_row(name, e, n, k, per, recipe, with_loop=per in (64, 512)))
        if args.quick:
            break
    for path in write_results("grouped_gemm", {"env": env, "rows": rows}, markdown(lines, rows)):
        print("wrote", path)


if __name__ == "__main__":
    main()
