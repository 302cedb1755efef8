"""Decode-shaped NVFP4 GEMM (packed weights, few rows: `nvfp4/decode_gemm_kernel.py`) vs cuBLAS
BF16 and `torch._grouped_mm` BF16, and vs the packed kernel it replaces at these shapes, same run.

    python -m benchmarks.decode_gemm [--sweep] [--splits] [--learner-forward]

Dense: M in {1, 16, 64} at N = K = 8192 and at the Qwen3-30B-A3B expert shapes (gate_up
1536 x 2048, down 2048 x 768); grouped (MoE): 128 experts at those shapes, 1 / 4 / 16 tokens per
expert. Every timing is `triton.testing.do_bench` with its L2 flush before each call (the weights
come from HBM, as in decode), median ms; weight GB/s = packed bytes (codes + E4M3 scales) / time,
beside the device copy's (read + write) GB/s measured in the same run. Before timing, every
config is checked bitwise against the learner's GEMM (on-grid weights, 512-row call) on
cancellation-heavy rows. `--sweep` times candidate tile configs too (speed only: each is checked
bitwise first); the pinned ones are in codegen/configs.py (`DECODE`). `--splits` times every
split-K count (1, 2, 4, 8 up to the K chunks: the same bits, checked first) beside the pinned
one; `--learner-forward` times the learner's forward GEMM (4096 rows, on-grid weights) in its
pinned chunked order against the one-chain order and tile it replaced, paired (the cost of the
chunked K order to the learner). Figures: "emulated NVFP4 (sm_90)".
"""

from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.common import fmt, header, write_results
from benchmarks.decode_gemm_k_chunks import (
    chunks_of,
    k_chunk_lines,
    learner_forward_rows,
    split_rows,
)
from benchmarks.decode_gemm_rows import (
    DENSE,
    DENSE_M,
    GROUPED,
    PER_EXPERT,
    cancellation_rows,
    dense_row,
    flushed_ms,
    grouped_row,
    on_grid_activation,
    quantized_weights,
)


def copy_gbps() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / flushed_ms(lambda: dst.copy_(src)) / 1e6


def check_bitwise(cfg, splits=(None,), k=2048) -> bool:
    """Rows of the decode kernel (m rows, dense and grouped with a gather; every split count in
    `splits`, None = the pinned one) == the same rows of the learner's on-grid GEMM over 512
    rows, at in-features `k`."""
    from fp4_compile.codegen.nvfp4.decode_gemm_kernel import launch_decode_gemm
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm

    ok = True
    _, wq = quantized_weights(0, 320, k, 1)
    og = wq.on_grid(torch.bfloat16)
    a, gd_a = on_grid_activation(cancellation_rows(512, k, 2).to(torch.bfloat16))
    full = launch_gemm(a, gd_a, og, wq.global_decode, out_dtype=torch.float32)
    packed = (wq.codes, wq.block_scales.view(torch.uint8))
    for m, split in itertools.product(sorted({1, 3, cfg.block_t - 1, cfg.block_t, 64}), splits):
        y = launch_decode_gemm(
            a[:m],
            gd_a[:m],
            packed,
            wq.global_decode,
            out_dtype=torch.float32,
            config=cfg,
            splits=split,
        )
        ok &= bool(torch.equal(y.view(torch.int32), full[:m].view(torch.int32)))
    _, wqe = quantized_weights(4, 192, 768, 3)
    oge = wqe.on_grid(torch.bfloat16)
    a, gd_a = on_grid_activation(cancellation_rows(40, 768, 4).to(torch.bfloat16))
    offs = torch.tensor([5, 5, 21, 40], dtype=torch.int32, device="cuda")
    rows = torch.randint(-1, 40, (40,), device="cuda", dtype=torch.int32)
    want = launch_gemm(
        a,
        gd_a,
        oge,
        wqe.global_decode,
        out_dtype=torch.float32,
        offsets=offs,
        rows_per_group=512,
        a_rows=rows,
    )
    got = launch_decode_gemm(
        a,
        gd_a,
        (wqe.codes, wqe.block_scales.view(torch.uint8)),
        wqe.global_decode,
        out_dtype=torch.float32,
        offsets=offs,
        a_rows=rows,
        config=cfg,
    )
    ok &= bool(torch.equal(got.view(torch.int32), want.view(torch.int32)))
    return ok


def sweep_configs(only: str = "all"):
    """The candidate tiles; only="weights_right": the learner-orientation ones alone."""
    from fp4_compile.codegen.configs import DecodeConfig

    if only not in ("all", "weights_right"):
        raise ValueError(f"only must be 'all' or 'weights_right', got {only!r}")
    # BLOCK_W 64 (one warpgroup's wgmma rows: the most programs), the word decode (the fewest
    # instructions, tools.decode_sass_audit): K step and pipeline depth decide the bytes in
    # flight per program
    for t, k, stages in itertools.product((16, 64), (128, 256, 512), (2, 3, 4, 6)):
        if only == "all" and k * stages <= 1536:
            yield DecodeConfig(t, 64, k, num_warps=4, num_stages=stages)
    # the learner's orientation: tokens the left operand (64 rows: wgmma), the decoded weights
    # the right one through shared memory (no register layout conversion; async wgmma). There
    # the weight rows are the wgmma's N (>= 8), so BLOCK_W 32 / 16 gives a dense weight 2x / 4x
    # the programs of BLOCK_W 64 (the parallelism limiter in docs/decode.md)
    for w, k, stages in itertools.product((64, 32, 16), (128, 256), (2, 3, 4)):
        yield DecodeConfig(64, w, k, num_warps=4, num_stages=stages, weights_right=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time candidate tile configs too")
    parser.add_argument(
        "--sweep-only",
        default="all",
        choices=("all", "weights_right"),
        help="weights_right: only the learner-orientation candidates",
    )
    parser.add_argument("--splits", action="store_true", help="time every split-K count")
    parser.add_argument(
        "--k-chunk",
        type=int,
        default=None,
        help="what-if: run with this sm_90 K chunk for the forward GEMMs (the "
        "learner's reference and the decode alike) instead of the pinned one; "
        "sm_90 pins 0 (one chain), so --splits needs it, e.g. 1024",
    )
    parser.add_argument(
        "--learner-forward",
        action="store_true",
        help="the learner's forward GEMM: chunked K vs the one-chain pin",
    )
    args = parser.parse_args()
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.configs import pick_decode

    if args.k_chunk is not None:  # both forward ops: the learner's reference and the decode agree
        what_if = configs.what_if_k_chunk("sm_90", args.k_chunk)
        try:
            what_if.__enter__()  # for the whole run
        except ValueError as e:
            raise SystemExit(f"--k-chunk: {e}") from None

    env, lines = header("NVFP4 decode GEMM (packed weights, few rows) vs BF16")
    env["k_chunk"] = configs.k_chunk("sm_90", "nvfp4_gemm")
    lines += [
        f"K chunk (sm_90 forward GEMMs): {env['k_chunk']}"
        + (" (--k-chunk what-if, not the pinned order)" if args.k_chunk is not None else ""),
        "",
    ]
    copy = copy_gbps()
    print(f"device copy {copy:.0f} GB/s (read + write)", flush=True)
    pinned = {m: pick_decode("sm_90", m) for m in (1, 16, 64)}
    bitwise_pinned = {str(c): check_bitwise(c) for c in set(pinned.values())}
    every = tuple(s for s in (1, 2, 3, 4, 8) if s <= chunks_of(8192))
    bitwise_pinned[f"splits {every}, K = 8192"] = all(
        check_bitwise(c, splits=every, k=8192) for c in set(pinned.values())
    )
    print("pinned configs bitwise:", bitwise_pinned, flush=True)
    rows = [dense_row(name, m, n, k) for name, (n, k) in DENSE.items() for m in DENSE_M]
    rows += [
        grouped_row(name, e, n, k, per) for name, (e, n, k) in GROUPED.items() for per in PER_EXPERT
    ]
    for r in rows:
        print(r, flush=True)
    splits = split_rows() if args.splits else []
    learner_fwd = learner_forward_rows() if args.learner_forward else []
    sweep = []
    if args.sweep:
        for cfg in sweep_configs(args.sweep_only):
            try:
                entry = {"config": str(cfg), "bitwise": check_bitwise(cfg)}
                ms = (
                    [1, 16, 64] if cfg.weights_right else [16, 64] if cfg.block_t == 64 else [1, 16]
                )
                entry["dense"] = {
                    f"{name}_M{m}": dense_row(name, m, n, k, cfg)["decode_ms"]
                    for name, (n, k) in DENSE.items()
                    for m in ms
                }
                entry["grouped"] = {
                    f"{name}_per{per}": grouped_row(name, e, n, k, per, cfg)["decode_ms"]
                    for name, (e, n, k) in GROUPED.items()
                    for per in (4, 16)
                }
            except Exception as exc:  # a config that does not compile or fit: recorded as such
                entry = {"config": str(cfg), "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            print(entry, flush=True)
            sweep.append(entry)
    lines += [
        f"Device copy: {copy:.0f} GB/s (read + write). Pinned configs bitwise == the "
        f"learner's GEMM: {bitwise_pinned}.",
        "",
        "GPU ms per call from CUDA-graph replays rotating through weight copies larger "
        "than L2 (weights from HBM); `decode eager ms` is one eager launch (L2 flushed), "
        "host launch cost included.",
        "",
        "| shape | M or tokens/expert | BF16 ms | decode ms | ratio vs BF16 | previous packed ms "
        "| weight GB/s | % of copy | decode eager ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        m = r.get("M", r.get("per_expert"))
        shape = f"{r['kind']} {r['name']} {r['N']}x{r['K']}" + (
            f" x{r['E']}" if r["kind"] == "grouped" else ""
        )
        lines.append(
            f"| {shape} | {m} | {r['bf16_ms']:.4f} | {r['decode_ms']:.4f} | "
            f"{fmt(r['vs_bf16'], '.2f')}x | {r['old_packed_ms']:.4f} | "
            f"{r['weight_GBps']:.0f} | {100 * r['weight_GBps'] / copy:.0f}% | "
            f"{r['decode_eager_ms']:.4f} |"
        )
    lines += k_chunk_lines(splits, learner_fwd)
    if sweep:
        lines += ["", "Sweep (ms; configs failing the bitwise check are marked):", ""]
        for s in sweep:
            lines.append(
                f"- {s['config']}: "
                + (
                    s.get("error")
                    or (
                        ("" if s["bitwise"] else "NOT BITWISE ")
                        + ", ".join(
                            f"{k} {v:.4f}" for k, v in {**s["dense"], **s["grouped"]}.items()
                        )
                    )
                )
            )
    path = write_results(
        "decode_gemm",
        {
            "env": env,
            "copy_GBps": copy,
            "rows": rows,
            "bitwise_pinned": bitwise_pinned,
            "sweep": sweep,
            "splits": splits,
            "learner_forward": learner_fwd,
        },
        "\n".join(lines) + "\n",
    )
    print("\n".join(lines))
    print("wrote", *path)


if __name__ == "__main__":
    main()
