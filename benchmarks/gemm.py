# ruff: noqa: B023  (each benchmarked closure is timed immediately, inside its own iteration)
"""NVFP4 W4A4 GEMM (`fp4_compile::nvfp4_linear` on the Triton kernels) vs cuBLAS BF16, same run.

    python -m benchmarks.gemm [--quick]

Shapes: 8192^3 and 4096^3; decode M in {1, 16, 64} at N = K = 8192; Qwen3-30B-A3B attention
(hidden 2048: q 4096, kv 512, o 2048 <- 4096) at M 16..4096. Per shape: the whole op (quantize x +
GEMM; packed weights or the on-grid BF16 copy the learner keeps), the GEMM kernel alone, achieved
TFLOP/s and weight-read GB/s from the CUDA-graph time. Figures: "emulated NVFP4 (sm_90)".
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.common import both, fmt, header, ratio, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.nvfp4 import gemm as impl

SHAPES = [
    ("square_8192", 8192, 8192, 8192),
    ("square_4096", 4096, 4096, 4096),
    *[("decode_8192", m, 8192, 8192) for m in (1, 16, 64)],
    *[
        (name, m, n, k)
        for name, n, k in (("q_proj", 4096, 2048), ("kv_proj", 512, 2048), ("o_proj", 2048, 4096))
        for m in (16, 64, 256, 4096)
    ],
]


def measure(name, m, n, k, recipe) -> dict:
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    wq = quantize_triton(w, block="16x16", global_scale="per_tensor")
    w_og = wq.on_grid(torch.bfloat16)
    codes, sc, gd = wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode
    a, gd_a = quantize_triton(x, global_scale="per_row", out="ongrid")
    row = {"name": name, "M": m, "N": n, "K": k}
    row["bf16"] = both(lambda: F.linear(x, w))
    row["op_packed"] = both(lambda: impl.cuda_linear(x, codes, sc, gd, None, None, recipe, None))
    row["op_ongrid"] = both(lambda: impl.cuda_linear(x, codes, sc, gd, w_og, None, recipe, None))
    row["gemm_packed"] = both(
        lambda: launch_gemm(a, gd_a, (codes, sc), gd, out_dtype=torch.bfloat16)
    )
    row["gemm_ongrid"] = both(lambda: launch_gemm(a, gd_a, w_og, gd, out_dtype=torch.bfloat16))
    flop = 2.0 * m * n * k
    for key in ("bf16", "gemm_packed", "gemm_ongrid"):
        g = row[key][1]
        row[f"{key}_tflops"] = None if not g else flop / g / 1e9
    packed_bytes = n * k * (0.5 + 1 / 16)
    g = row["gemm_packed"][1]
    row["gemm_packed_weight_GBps"] = None if not g else packed_bytes / g / 1e6
    g = row["bf16"][1]
    row["bf16_weight_GBps"] = None if not g else n * k * 2 / g / 1e6
    print(row, flush=True)
    return row


def markdown(lines, rows) -> str:
    lines += [
        "| shape | M | N | K | cuBLAS BF16 launch / graph | op packed launch / graph | "
        "op on-grid launch / graph | GEMM packed graph | GEMM on-grid graph | ratio op packed "
        "(graph) | ratio op on-grid (graph) | TFLOP/s BF16 / packed / on-grid | weight GB/s "
        "BF16 / packed |",
        "| --- " * 13 + "|",
    ]
    for r in rows:
        b, p, o = r["bf16"], r["op_packed"], r["op_ongrid"]
        lines.append(
            f"| {r['name']} | {r['M']} | {r['N']} | {r['K']} | {fmt(b[0])} / {fmt(b[1])} | "
            f"{fmt(p[0])} / {fmt(p[1])} | {fmt(o[0])} / {fmt(o[1])} | {fmt(r['gemm_packed'][1])} | "
            f"{fmt(r['gemm_ongrid'][1])} | {fmt(ratio(b[1], p[1]), '.2f')} | "
            f"{fmt(ratio(b[1], o[1]), '.2f')} | {fmt(r['bf16_tflops'], '.0f')} / "
            f"{fmt(r['gemm_packed_tflops'], '.0f')} / {fmt(r['gemm_ongrid_tflops'], '.0f')} | "
            f"{fmt(r['bf16_weight_GBps'], '.0f')} / {fmt(r['gemm_packed_weight_GBps'], '.0f')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first three shapes only")
    args = parser.parse_args()
    env, lines = header("NVFP4 GEMM vs cuBLAS BF16")
    recipe = NVFP4Recipe.strict()
    rows = [measure(*s, recipe) for s in (SHAPES[:3] if args.quick else SHAPES)]
    for path in write_results("gemm", {"env": env, "rows": rows}, markdown(lines, rows)):
        print("wrote", path)


if __name__ == "__main__":
    main()
