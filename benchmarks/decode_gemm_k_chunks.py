"""`benchmarks.decode_gemm --splits / --learner-forward`: the K-chunked summation order's two
sides on the GPU (codegen/configs.py 1., `nvfp4/k_chunks.py`). Split-K decode: every split count
of the pinned tile (bitwise == the learner's GEMM: `benchmarks.decode_gemm.check_bitwise` runs
first) vs cuBLAS BF16. The learner: its forward GEMM in the chunked order vs the one-chain order
and tile it replaced, paired. Figures: "emulated NVFP4 (sm_90)". Shapes, operands and rows:
`benchmarks.decode_gemm_rows`."""

from __future__ import annotations

import functools
import itertools

import torch
import torch.nn.functional as F

from benchmarks.common import fmt, ratio
from benchmarks.decode_gemm_rows import (
    DENSE,
    DENSE_M,
    SPLITS,
    cancellation_rows,
    dense_row,
    on_grid_activation,
    quantized_weights,
)


def chunk_size() -> int:
    """The sm_90 KC, or 1024 where sm_90 pins one chain (the size these figures measure)."""
    from fp4_compile.codegen.configs import k_chunk

    return k_chunk("sm_90", "nvfp4_gemm") or 1024


def chunks_of(k: int) -> int:
    """K chunks of the pinned sm_90 order (1: one chain, no split possible)."""
    from fp4_compile.codegen.configs import k_chunk
    from fp4_compile.codegen.nvfp4.k_chunks import chunk_count

    return chunk_count(k, k_chunk("sm_90", "nvfp4_gemm"))


def split_rows() -> list[dict]:
    """Dense decode at every split count (pinned tile), ms and ratio vs cuBLAS BF16."""
    out = []
    for (name, (n, k)), m in itertools.product(DENSE.items(), DENSE_M):
        row = {"name": name, "M": m, "N": n, "K": k, "splits": {}}
        for s in (s for s in SPLITS if s <= chunks_of(k)):
            r = dense_row(name, m, n, k, splits=s)
            row["bf16_ms"] = r["bf16_ms"]
            row["splits"][s] = r["decode_ms"]
        best = min(row["splits"], key=row["splits"].get)
        row["best"] = best
        row["best_vs_bf16"] = ratio(row["bf16_ms"], row["splits"][best])
        print(row, flush=True)
        out.append(row)
    return out


def learner_tiles() -> dict:
    """name -> (TileConfig or None = the pinned one, KC or None = the pinned one): the learner's
    forward candidates. 128x256 (8 warps) spills once the chunk total sits beside the
    accumulator (tools.decode_sass_audit); timed, not assumed slow."""
    from fp4_compile.codegen.configs import TileConfig

    wide = TileConfig(128, 256, 64, num_warps=8, num_stages=4)
    kc = chunk_size()
    return {
        "chunked_ms": (TileConfig(128, 128, 64, num_warps=8, num_stages=4), kc),
        "one_chain_ms": (wide, 0),
        "wide_chunked_ms": (wide, kc),
        "wide3_chunked_ms": (TileConfig(128, 256, 64, num_warps=8, num_stages=3), kc),
        "k128_chunked_ms": (TileConfig(128, 128, 128, num_warps=8, num_stages=3), kc),
    }


def learner_forward_rows(rows: int = 4096) -> list[dict]:
    """The learner's forward GEMM (on-grid weights): the pinned tile + chunked K vs the one-chain
    pin it replaced (128x256x64, 8 warps, 4 stages, KC 0) and the other `learner_tiles`, paired:
    3 rounds, each timing every candidate in one CUDA graph, the median kept."""
    import triton.testing

    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm

    out = []
    for name, (n, k) in DENSE.items():
        w, wq = quantized_weights(0, n, k, 9)
        x = cancellation_rows(rows, k, 10).to(torch.bfloat16)
        a, gd_a = on_grid_activation(x)
        args = (a, gd_a, wq.on_grid(torch.bfloat16), wq.global_decode)
        kw = {"out_dtype": torch.bfloat16, "config_op": "nvfp4_gemm_ongrid"}
        fns = {
            key: functools.partial(launch_gemm, *args, **kw, config=cfg, k_chunk_override=kc)
            for key, (cfg, kc) in learner_tiles().items()
        }
        fns["bf16_ms"] = functools.partial(F.linear, x, w)
        ref = fns["chunked_ms"]().view(torch.int16)
        row = {
            "name": name,
            "M": rows,
            "N": n,
            "K": k,
            "same_bits_as_pinned": {
                key: bool(torch.equal(fn().view(torch.int16), ref))
                for key, fn in fns.items()
                if key not in ("bf16_ms", "one_chain_ms")
            },
        }
        for _ in range(3):
            for key, fn in fns.items():
                row.setdefault(key, []).append(
                    float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))
                )
        for key in fns:
            row[key] = sorted(row[key])[1]
        for key in learner_tiles():
            row[key.replace("_ms", "_vs_one_chain")] = ratio(row["one_chain_ms"], row[key])
        print(row, flush=True)
        out.append(row)
    return out


def k_chunk_lines(splits: list[dict], learner_fwd: list[dict]) -> list[str]:
    """The markdown tables of `split_rows` and `learner_forward_rows` (empty lists: none)."""
    lines = []
    if splits:
        lines += [
            "",
            "Split-K (pinned tile; every split count bitwise == the learner, checked "
            "above): ms per split count, the best vs cuBLAS BF16.",
            "",
            "| shape | M | BF16 ms | ms by splits | best | best vs BF16 |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in splits:
            by = ", ".join(f"{s}: {v:.4f}" for s, v in r["splits"].items())
            lines.append(
                f"| {r['name']} {r['N']}x{r['K']} | {r['M']} | {r['bf16_ms']:.4f} | {by} "
                f"| {r['best']} | {fmt(r['best_vs_bf16'], '.2f')}x |"
            )
    if learner_fwd:
        lines += [
            "",
            "The learner's forward GEMM (4096 rows, on-grid weights, CUDA-graph "
            "median of 3 paired rounds): pinned 128x128 tile with K chunks vs the "
            "one-chain 128x256 pin it replaced, and cuBLAS BF16.",
            "",
            "| shape | " + " | ".join(learner_tiles()) + " | BF16 ms | vs one chain "
            "(pinned, wide, wide 3 stages, BLOCK_K 128) | same bits as pinned |",
            "| --- |" + " --- |" * (len(learner_tiles()) + 3),
        ]
        for r in learner_fwd:
            vs = ", ".join(
                fmt(r[k.replace("_ms", "_vs_one_chain")], ".3f") + "x"
                for k in learner_tiles()
                if k != "one_chain_ms"
            )
            lines.append(
                f"| {r['name']} {r['N']}x{r['K']} | "
                + " | ".join(f"{r[k]:.4f}" for k in learner_tiles())
                + f" | {r['bf16_ms']:.4f} | {vs} | {all(r['same_bits_as_pinned'].values())} |"
            )
    return lines


def main() -> None:
    """`python -m benchmarks.decode_gemm_k_chunks`: the learner-forward table alone."""
    from benchmarks.common import header, write_results

    env, lines = header("The learner's forward GEMM in the K-chunked order (tiles) vs one chain")
    rows = learner_forward_rows()
    lines += k_chunk_lines([], rows)
    path = write_results(
        "learner_forward_k_chunks", {"env": env, "rows": rows}, "\n".join(lines) + "\n"
    )
    print("\n".join(lines))
    print("wrote", *path)


if __name__ == "__main__":
    main()
