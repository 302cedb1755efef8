# ruff: noqa: B023  (each benchmarked closure is timed immediately, inside its own iteration)
"""Offline tuner of the pinned kernel configs (`codegen/configs.py`) on the learner's shapes.

    python -m tools.tune_kernels [--only quantize,wgrad,grouped,dense,weights,rowscale,narrow]

Qwen3-30B-A3B-shaped learner step (4096 tokens, top-8 of 128 experts, ~256 tokens per expert,
routing drawn at random so the groups are uneven as in training). For every candidate config it
times the kernel (`triton.testing.do_bench` median) and compares its output BYTES with the
pinned config's: a candidate that changes any bit is reported and must not be pinned (the
GEMM's K chunk, BLOCK_K, is varied only as a probe of the wgrad; see configs.py). Baselines in the same run: the
device copy for the quantizer, `torch._grouped_mm` / `torch.mm` BF16 for the GEMMs.
Nothing here is read at run time: a winner is copied into configs.py by hand, then re-checked by
the GPU tests (`pytest -m gpu`). Figures: "emulated NVFP4 (sm_90)".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch

from benchmarks.common import environment, write_results
from benchmarks.common import median_ms as bench
from fp4_compile import NVFP4Recipe
from fp4_compile.codegen import configs
from fp4_compile.codegen.configs import TileConfig
from fp4_compile.testing import count_bytes_differ

TOKENS, EXPERTS, TOPK, HIDDEN, MOE_I = 4096, 128, 8, 2048, 768

# The 2026-12-03 sweep varied the tile at 32 elements per thread (about equal times); these give a
# thread 8-16 elements: fewer registers, more warps in flight for a latency-bound kernel.
QUANT_CANDIDATES = (
    TileConfig(16, 0, 256, num_warps=4, num_stages=1),
    TileConfig(16, 0, 128, num_warps=4, num_stages=1),
    TileConfig(16, 0, 64, num_warps=2, num_stages=1),
    TileConfig(16, 0, 64, num_warps=4, num_stages=1),
    TileConfig(32, 0, 128, num_warps=8, num_stages=1),
    TileConfig(16, 0, 128, num_warps=2, num_stages=1),
    TileConfig(32, 0, 256, num_warps=8, num_stages=1),
    TileConfig(64, 0, 128, num_warps=8, num_stages=1),
    TileConfig(16, 0, 512, num_warps=8, num_stages=1),
    TileConfig(32, 0, 128, num_warps=4, num_stages=1),
)
GEMM_CANDIDATES = (
    TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    TileConfig(64, 128, 64, num_warps=4, num_stages=4),
    TileConfig(64, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 64, num_warps=4, num_stages=4),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    TileConfig(64, 128, 64, num_warps=8, num_stages=4),
)
# The wgrad: ~256-token segments give each program only ~4 K steps, so the pipeline fill and
# the epilogue are not hidden within a program; fewer stages (less shared memory) let 2-3
# programs share an SM and hide them across programs. The 128-wide K chunk was probed in
# 2026-12-05_tune_kernels_weights_20848a7.md, the 3c3015c run (same bits, slower; not pinnable
# while configs.py asserts that the GEMMs share BLOCK_K).
WGRAD_CANDIDATES = (
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 64, num_warps=4, num_stages=4),
    TileConfig(128, 128, 64, num_warps=4, num_stages=2),
    TileConfig(128, 128, 64, num_warps=8, num_stages=2),
    TileConfig(128, 256, 64, num_warps=8, num_stages=2),
    TileConfig(256, 128, 64, num_warps=8, num_stages=2),
    TileConfig(256, 128, 64, num_warps=8, num_stages=3),
    TileConfig(64, 256, 64, num_warps=4, num_stages=2),
    TileConfig(128, 64, 64, num_warps=4, num_stages=2),
)


# The weights' one-read quantize: 4 warps keep more programs resident per SM (its persistent grid
# waits on all of them); 32 or 16 elements per thread.
WEIGHT_QUANT_CANDIDATES = (
    TileConfig(32, 0, 128, num_warps=4, num_stages=1),
    TileConfig(16, 0, 128, num_warps=2, num_stages=1),
    TileConfig(16, 0, 128, num_warps=4, num_stages=1),
    TileConfig(64, 0, 128, num_warps=8, num_stages=1),
    TileConfig(32, 0, 256, num_warps=8, num_stages=1),
)


# `--deep`: the pinned on-grid / wgrad tile (first) against deeper software pipelines of the same
# tile and its transpose (4 stages of 128x256x64 operands: 192 KiB of shared memory, 1 program per
# SM) and the packed table's tile, for the MoE GEMMs only (`--only grouped,wgrad`).
DEEP_CANDIDATES = (
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 256, 64, num_warps=8, num_stages=4),
    TileConfig(256, 128, 64, num_warps=8, num_stages=3),
    TileConfig(256, 128, 64, num_warps=8, num_stages=4),
)


@contextlib.contextmanager
def pinned(key, cfg: TileConfig):
    """Every M bucket of `key` (and its narrow-N config) replaced by `cfg` for the duration
    (restored after)."""
    saved, narrow = configs.PINNED[key], configs.NARROW_N.pop(key, None)
    configs.PINNED[key] = ((None, cfg),)
    try:
        yield
    finally:
        configs.PINNED[key] = saved
        if narrow is not None:
            configs.NARROW_N[key] = narrow


def routing_offsets(seed: int = 0) -> torch.Tensor:
    """int32 [E] group ends of a random top-8 routing of TOKENS tokens (uneven groups)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.randn(TOKENS, EXPERTS, device="cuda", generator=g)
    experts = scores.topk(TOPK, dim=-1).indices.reshape(-1)
    counts = torch.bincount(experts, minlength=EXPERTS)
    return torch.cumsum(counts, 0).to(torch.int32)


def _bytes(out) -> torch.Tensor:
    if isinstance(out, tuple):
        return torch.cat([t.reshape(-1).contiguous().view(torch.uint8) for t in out])
    return out.reshape(-1).contiguous().view(torch.uint8)


def sweep(section: str, case: str, key, candidates, run, rows: list, baseline_ms=None):
    """Time `run()` under the pinned config of `key` (its largest-M bucket), then under every
    other candidate; compare each output's bytes with the pinned one's."""
    ref = None
    pinned_now = configs.pick(*key, 2**31)
    for cfg in (pinned_now, *(c for c in candidates if c != pinned_now)):
        row = {
            "section": section,
            "case": case,
            "config": cfg.__dict__.copy(),
            "baseline_ms": baseline_ms,
        }
        try:
            with pinned(key, cfg):
                out = _bytes(run())
                row["ms"] = bench(run)
            if ref is None:
                ref = out
            row["bytes_differ_vs_pinned"] = count_bytes_differ(out, ref)
        except Exception as exc:  # a config that fails to compile or launch is recorded
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps(row), flush=True)
        rows.append(row)


def quantize_section(rows):
    from fp4_compile.codegen.nvfp4.grouped_wgrad_kernel import grouped_wgrad  # noqa: F401  (kernel module)
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_segments_ongrid, quantize_triton

    key = ("sm_90", "any", "nvfp4_quantize")
    x = torch.randn(TOKENS * TOPK, HIDDEN, device="cuda", dtype=torch.bfloat16)
    copy_ms = bench(lambda: x.clone())
    cases = {
        "activation [32768, 2048] per_row rne ongrid": lambda: quantize_triton(
            x, global_scale="per_row", out="ongrid"
        ),
        "gradient [32768, 2048] per_tensor SR ongrid": lambda: quantize_triton(
            x, global_scale="per_tensor", rounding="stochastic", seed=5, out="ongrid"
        ),
    }
    # the learner's weights: 16x16 tiles, per-expert scales, on-grid only (its GEMMs read
    # nothing else: passes/skip_unread_packed_weights.py), in the two-step form (this kernel
    # after the amax pass; the one-read launch has its own section, "weights")
    w = torch.randn(EXPERTS, 2 * MOE_I, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w_down = torch.randn(EXPERTS, HIDDEN, MOE_I, device="cuda", dtype=torch.bfloat16)
    cases["weight [128, 1536, 2048] per_expert 16x16 on-grid"] = lambda: quantize_triton(
        w, block="16x16", global_scale="per_expert", out="ongrid", one_read_weights=False
    )
    cases["weight [128, 2048, 768] per_expert 16x16 on-grid"] = lambda: quantize_triton(
        w_down, block="16x16", global_scale="per_expert", out="ongrid", one_read_weights=False
    )
    from fp4_compile.codegen.nvfp4.segment_layout_kernel import segment_layout

    offsets = routing_offsets()
    lay = segment_layout(offsets, x.shape[0])
    amax = torch.ones(EXPERTS, device="cuda")
    for case, run in cases.items():
        sweep("quantize", case, key, QUANT_CANDIDATES, run, rows, baseline_ms=copy_ms)
    segments = {  # the transposing quantize of the wgrad operands (token-major tiles)
        "wgrad dY^T segments [2048, C] SR ongrid": lambda: quantize_segments_ongrid(
            x, lay["src"], lay["block_group"], lay["start"], lay["width"], amax, seed=11
        ),
        "wgrad X^T segments [2048, C] RNE ongrid": lambda: quantize_segments_ongrid(
            x, lay["src"], lay["block_group"], lay["start"], lay["width"], amax
        ),
    }
    for case, run in segments.items():
        sweep(
            "quantize",
            case,
            ("sm_90", "any", "nvfp4_quantize_segments"),
            QUANT_CANDIDATES,
            run,
            rows,
            baseline_ms=copy_ms,
        )


def weights_section(rows):
    """The weights' one-read quantize (`weight_quantize_kernel.py`): tiles, programs per SM and
    (experts) expert groups, each against the two-step form's bytes (baseline = the two-step
    form's time, same run)."""
    from fp4_compile.codegen.nvfp4 import weight_quantize_kernel as wq
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    key = ("sm_90", "any", "nvfp4_weight_quantize")
    shapes = {
        "gate_up [128, 1536, 2048]": (EXPERTS, 2 * MOE_I, HIDDEN),
        "down [128, 2048, 768]": (EXPERTS, HIDDEN, MOE_I),
        "q_proj [4096, 2048] per_tensor": (1, 4096, HIDDEN),
    }
    for case, shape in shapes.items():
        w = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        mode = "per_tensor" if "per_tensor" in case else "per_expert"
        w = w[0] if mode == "per_tensor" else w
        two_step = quantize_triton(
            w, block="16x16", global_scale=mode, out="ongrid", one_read_weights=False
        )
        base_ms = bench(
            lambda: quantize_triton(
                w, block="16x16", global_scale=mode, out="ongrid", one_read_weights=False
            )
        )
        for per_sm in (1, 2, 4, 8):
            label = f"{case}, <= {per_sm} programs per SM"
            run = lambda per_sm=per_sm: wq.quantize_weight_tiles(  # noqa: E731
                w, mode, out="ongrid", programs_per_sm=per_sm
            )
            out = run()
            for got, want, what in ((out[0], two_step[0], "on-grid"), (out[1], two_step[1], "gd")):
                if count_bytes_differ(got, want):
                    raise AssertionError(f"{label}: {what} differs from the two-step form")
            sweep("weights", label, key, WEIGHT_QUANT_CANDIDATES, run, rows, baseline_ms=base_ms)
        if mode != "per_expert":
            continue
        for groups in (2, 4, 8, 16):  # expert groups (`configs.LAUNCH`'s weight_quantize_experts)
            label = f"{case}, <= 8 programs per SM, {groups} expert groups"
            run = lambda groups=groups: wq.quantize_weight_tiles(  # noqa: E731
                w, mode, out="ongrid", expert_groups=groups
            )
            out = run()
            for got, want, what in ((out[0], two_step[0], "on-grid"), (out[1], two_step[1], "gd")):
                if count_bytes_differ(got, want):
                    raise AssertionError(f"{label}: {what} differs from the two-step form")
            sweep("weights", label, key, WEIGHT_QUANT_CANDIDATES, run, rows, baseline_ms=base_ms)


# row_scale's backward (the MoE combine's, reading the slot gradients through the inverse
# permutation): (rows per program, warps, 64-column blocks per loop step). A latency-bound block
# loop at (16, 4, 1): 0.137 ms; more columns per step put more loads in flight (8, 2, 4: 0.0945).
ROW_SCALE_LAUNCHES = (
    (16, 4, 1),
    (16, 4, 2),
    (16, 4, 4),
    (8, 4, 4),
    (8, 4, 8),
    (16, 8, 4),
    (32, 8, 2),
    (32, 8, 4),
    (8, 2, 4),
    (4, 4, 8),
    (32, 4, 1),
)


def rowscale_section(rows):
    """row_scale's backward at the learner's combine shape, each launch against the first
    (pinned) one's bytes; baseline = a device copy of x (the bandwidth it competes with)."""
    from fp4_compile.codegen.moe import row_scale_kernel as rk

    s, h, k = TOKENS * TOPK, HIDDEN, TOPK
    x = torch.randn(s, h, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(s, 1, device="cuda", dtype=torch.float32)
    grad = torch.randn(TOKENS, h, device="cuda", dtype=torch.bfloat16)
    inverse = torch.randperm(s, device="cuda")
    copy_ms = bench(lambda: x.clone())
    key = ("cuda", "row_scale_backward")
    pinned_row, ref = configs.LAUNCH[key], None
    pinned_launch = (pinned_row["block_r"], pinned_row["num_warps"], pinned_row["most_blocks"])
    try:
        for launch in (pinned_launch, *(c for c in ROW_SCALE_LAUNCHES if c != pinned_launch)):
            configs.LAUNCH[key] = dict(zip(("block_r", "num_warps", "most_blocks"), launch))

            def run():
                return rk.row_scale_backward_triton(grad, x, w, 64, grad_rows=inverse, row_div=k)

            row = {
                "section": "rowscale",
                "case": f"combine backward [{s}, {h}] through the inverse",
                "config": {
                    "block_m": launch[0],
                    "block_n": 0,
                    "block_k": 64 * launch[2],
                    "num_warps": launch[1],
                    "num_stages": 1,
                },
                "baseline_ms": copy_ms,
            }
            out = _bytes(run())
            row["ms"] = bench(run)
            ref = out if ref is None else ref
            row["bytes_differ_vs_pinned"] = count_bytes_differ(out, ref)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        configs.LAUNCH[key] = pinned_row


def wgrad_section(rows):
    import triton

    from fp4_compile.codegen.nvfp4 import grouped_wgrad_kernel as gw
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_segments_ongrid
    from fp4_compile.codegen.nvfp4.segment_layout_kernel import segment_layout

    offsets = routing_offsets()
    for name, n, k in (("gate_up", 2 * MOE_I, HIDDEN), ("down", HIDDEN, MOE_I)):
        dy = torch.randn(TOKENS * TOPK, n, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(TOKENS * TOPK, k, device="cuda", dtype=torch.bfloat16)
        base = bench(lambda: torch._grouped_mm(dy.t(), x, offs=offsets))
        lay = segment_layout(offsets, dy.shape[0])
        seg = (lay["block_group"], lay["start"], lay["width"])
        a, gd_a = quantize_segments_ongrid(dy, lay["src"], *seg, torch.ones(EXPERTS, device="cuda"))
        b, gd_b = quantize_segments_ongrid(x, lay["src"], *seg, torch.ones(EXPERTS, device="cuda"))
        out = torch.empty((EXPERTS, n, k), dtype=torch.bfloat16, device="cuda")
        for align in (1, 16):

            def run(align=align):
                cfg = configs.pick("sm_90", "bf16", "nvfp4_wgrad", n)
                grid = (triton.cdiv(n, cfg.block_m), triton.cdiv(k, cfg.block_n), EXPERTS)
                gw._grouped_wgrad_kernel[grid](
                    a,
                    b,
                    gd_a,
                    gd_b,
                    out,
                    lay["start"],
                    lay["width"],
                    n,
                    k,
                    a.stride(0),
                    b.stride(0),
                    gd_a.stride(0),
                    0,
                    out.stride(0),
                    out.stride(1),
                    DOT_F32=False,
                    BLOCK_M=cfg.block_m,
                    BLOCK_N=cfg.block_n,
                    BLOCK_K=cfg.block_k,
                    SEGMENT_ALIGN=align,
                    **cfg.launch_kwargs(),
                    enable_fp_fusion=False,
                )
                return out

            if align == 1 and os.environ.get("TUNE_WGRAD_ALIGN1") != "1":
                # measured in 2026-12-05_tune_kernels_weights_20848a7.md, the c587fdc run (3.5x
                # slower)
                continue
            cands = WGRAD_CANDIDATES if align == 16 else GEMM_CANDIDATES[:1]
            sweep(
                "wgrad kernel",
                f"{name} [128,{n},{k}] align {align}",
                ("sm_90", "bf16", "nvfp4_wgrad"),
                cands,
                run,
                rows,
                baseline_ms=base,
            )


def grouped_section(rows):
    from fp4_compile.codegen.nvfp4 import gemm as impl
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    recipe = NVFP4Recipe.strict()
    offsets = routing_offsets()
    key = ("sm_90", "bf16", "nvfp4_gemm")
    for name, n, k in (("gate_up", 2 * MOE_I, HIDDEN), ("down", HIDDEN, MOE_I)):
        w = torch.randn(EXPERTS, n, k, device="cuda", dtype=torch.bfloat16)
        wq = quantize_triton(w, block="16x16", global_scale="per_expert")
        codes, sc, gd = wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode
        w_og = wq.on_grid(torch.bfloat16)
        x = torch.randn(TOKENS * TOPK, k, device="cuda", dtype=torch.bfloat16)
        base = bench(lambda: torch._grouped_mm(x, w.transpose(-1, -2), offs=offsets))
        for label, wog in (("packed", None), ("ongrid", w_og)):
            key = ("sm_90", "bf16", "nvfp4_gemm" if wog is None else "nvfp4_gemm_ongrid")

            def run(wog=wog):
                return impl.cuda_linear(x, codes, sc, gd, wog, None, recipe, None, offsets=offsets)

            sweep(
                "grouped forward",
                f"{name} [128,{n},{k}] {label}",
                key,
                GEMM_CANDIDATES,
                run,
                rows,
                baseline_ms=base,
            )
        dy = torch.randn(TOKENS * TOPK, n, device="cuda", dtype=torch.bfloat16)
        a, gd_a = quantize_triton(dy, global_scale="per_tensor", out="ongrid")
        base = bench(lambda: torch._grouped_mm(dy, w, offs=offsets))
        rows_per = -(-a.shape[0] // EXPERTS)

        def run():
            return launch_gemm(
                a,
                gd_a,
                w_og.transpose(-1, -2),
                gd,
                out_dtype=torch.bfloat16,
                offsets=offsets,
                rows_per_group=rows_per,
            )

        key = ("sm_90", "bf16", "nvfp4_gemm_ongrid")
        sweep(
            "grouped dgrad",
            f"{name} W^T on-grid",
            key,
            GEMM_CANDIDATES,
            run,
            rows,
            baseline_ms=base,
        )


def dense_section(rows):
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    key = ("sm_90", "bf16", "nvfp4_gemm")
    for name, n, k in (("q_proj", 4096, HIDDEN), ("o_proj", HIDDEN, 4096)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
        wq = quantize_triton(w, block="16x16", global_scale="per_tensor")
        a, gd_a = quantize_triton(x, global_scale="per_row", out="ongrid")
        base = bench(lambda: torch.mm(x, w.t()))
        b = (wq.codes, wq.block_scales.view(torch.uint8))

        def run():
            return launch_gemm(a, gd_a, b, wq.global_decode, out_dtype=torch.bfloat16)

        sweep(
            "dense forward",
            f"{name} M {TOKENS} packed",
            key,
            GEMM_CANDIDATES,
            run,
            rows,
            baseline_ms=base,
        )


def graph_bench(fn) -> float:
    """ms of one call of fn replayed from a CUDA graph (`do_bench_cudagraph` median): no host
    time. A GEMM of ~30 us launched through `launch_gemm`'s Python takes about as long on the
    host, and `do_bench` then times the host (its narrow rows of b168d97 swung 0.03-0.11 ms)."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def narrow_section(rows):
    """The k / v projections (N = 512 = 4 KV heads x 128): at the pinned 128x256 tiles their
    forward launches 64 programs and their wgrad [512, 2048] over 4096 tokens 32, on 132 SMs.
    Forward (on-grid weight), dgrad (W^T view) and the wgrad's GEMM on its quantized operands,
    each against torch.mm BF16; all timed from CUDA graphs (`graph_bench`). The q / o shapes
    (N = 4096 / 2048) too: the on-grid table was tuned on the MoE shapes only."""
    from fp4_compile.codegen.nvfp4 import gemm as impl
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    global bench
    saved, bench = bench, graph_bench
    try:
        ongrid, wgrad = ("sm_90", "bf16", "nvfp4_gemm_ongrid"), ("sm_90", "bf16", "nvfp4_wgrad")
        for name, n, k in (("k/v", 512, HIDDEN), ("q", 4096, HIDDEN), ("o", HIDDEN, 4096)):
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16)
            wq = quantize_triton(w, block="16x16", global_scale="per_tensor")
            w_og, gd_w = wq.on_grid(torch.bfloat16), wq.global_decode
            a, gd_a = quantize_triton(x, global_scale="per_row", out="ongrid")
            d, gd_d = quantize_triton(dy, global_scale="per_tensor", out="ongrid")
            dt, gd_dt = impl.quantize_transposed_ongrid(dy, global_scale="per_tensor")
            xt, gd_xt = impl.quantize_transposed_ongrid(x, global_scale="per_tensor")
            sweep(
                "dense forward",
                f"{name} proj [{TOKENS}, {k}] x [{n}, {k}]^T on-grid",
                ongrid,
                GEMM_CANDIDATES,
                lambda: launch_gemm(a, gd_a, w_og, gd_w, out_dtype=torch.bfloat16),
                rows,
                baseline_ms=bench(lambda: torch.mm(x, w.t())),
            )
            sweep(
                "dense dgrad",
                f"{name} proj dY [{TOKENS}, {n}] x W [{n}, {k}]",
                ongrid,
                GEMM_CANDIDATES,
                lambda: launch_gemm(d, gd_d, w_og.t(), gd_w, out_dtype=torch.bfloat16),
                rows,
                baseline_ms=bench(lambda: torch.mm(dy, w)),
            )
            sweep(
                "dense wgrad",
                f"{name} proj dW [{n}, {k}] over {TOKENS} tokens (GEMM)",
                wgrad,
                GEMM_CANDIDATES + WGRAD_CANDIDATES[:1],
                lambda: launch_gemm(
                    dt, gd_dt, xt, gd_xt, out_dtype=torch.bfloat16, config_op="nvfp4_wgrad"
                ),
                rows,
                baseline_ms=bench(lambda: torch.mm(dy.t(), x)),
            )
    finally:
        bench = saved


SECTIONS = {
    "wgrad": wgrad_section,
    "quantize": quantize_section,
    "weights": weights_section,
    "grouped": grouped_section,
    "dense": dense_section,
    "rowscale": rowscale_section,
    "narrow": narrow_section,
}


def markdown(env, rows) -> str:
    lines = [
        f"# kernel config sweep, {env['gpu']} (emulated NVFP4 (sm_90))",
        "",
        f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}, "
        f"{env['date']}. ms = do_bench median; baseline = device copy (quantize), the "
        "two-step quantize (weights) or BF16 torch._grouped_mm / mm (GEMMs), same run; `differ` = output bytes that differ "
        "from the pinned config's (first row of each case).",
        "",
        "| section | case | BLOCK_M x N x K, warps, stages | ms | baseline ms | baseline / ms "
        "| differ |",
        "| --- " * 7 + "|",
    ]
    for r in rows:
        c = r["config"]
        cfg = f"{c['block_m']}x{c['block_n']}x{c['block_k']}, {c['num_warps']}w, {c['num_stages']}s"
        if "error" in r:
            lines.append(
                f"| {r['section']} | {r['case']} | {cfg} | ERROR {r['error'][:80]} | | | |"
            )
            continue
        ratio = r["baseline_ms"] / r["ms"] if r.get("baseline_ms") else float("nan")
        lines.append(
            f"| {r['section']} | {r['case']} | {cfg} | {r['ms']:.4f} | "
            f"{r['baseline_ms']:.4f} | {ratio:.2f} | {r['bytes_differ_vs_pinned']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument(
        "--deep",
        action="store_true",
        help="GEMM / wgrad candidates: DEEP_CANDIDATES (pipeline depth)",
    )
    args = parser.parse_args()
    if args.deep:
        global GEMM_CANDIDATES, WGRAD_CANDIDATES
        GEMM_CANDIDATES = WGRAD_CANDIDATES = DEEP_CANDIDATES
    if not torch.cuda.is_available():
        raise SystemExit("this tuner needs a CUDA GPU")
    env = environment()
    rows: list = []
    for name in args.only.split(","):
        SECTIONS[name](rows)
        # written after every section: a cut run keeps what it measured
        write_results("tune_kernels", {"env": env, "rows": rows}, markdown(env, rows))
    print(markdown(env, rows))


if __name__ == "__main__":
    main()
