"""The decode GEMM benchmarks' shared pieces (`benchmarks.decode_gemm`, and its K-chunk tables
`benchmarks.decode_gemm_k_chunks`): the shapes, the operands (cancellation-heavy rows, NVFP4
weights and activations, cached per shape) and the timed rows of one shape, decode kernel vs
cuBLAS BF16 (dense) or `torch._grouped_mm` (MoE). Figures: "emulated NVFP4 (sm_90)"."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from benchmarks.common import ratio

DENSE = {
    "square_8192": (8192, 8192),
    "attn_q": (4096, 2048),
    "attn_o": (2048, 4096),
    "expert_gate_up": (1536, 2048),
    "expert_down": (2048, 768),
}
SPLITS = (1, 2, 4, 8)
DENSE_M = (1, 16, 64)
GROUPED = {"gate_up": (128, 1536, 2048), "down": (128, 2048, 768)}
PER_EXPERT = (1, 4, 16)


def flushed_ms(fn) -> float:
    """Eager launches (L2 flushed before each): what a call costs with its host launch."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def copies(nbytes: int) -> int:
    """Weight copies to rotate through so that together they exceed the 50 MB L2 four times."""
    return max(2, min(64, -(-200_000_000 // nbytes)))


def rotating_graph_ms(fn, weights: list) -> float:
    """GPU time per call of fn(weight): one call per copy in `weights` (together far larger than
    L2, so every call streams its weights from HBM as in decode) captured in one CUDA graph and
    replayed (`do_bench_cudagraph`), median / len(weights). No host launch cost."""
    import triton.testing

    def run():
        for w in weights:
            fn(w)

    return float(triton.testing.do_bench_cudagraph(run, rep=50, return_mode="median")) / len(
        weights
    )


@functools.cache
def cancellation_rows(m, k, seed):
    """Cancellation-heavy rows: magnitudes 1e-4..1e2 along K, both signs."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=g, device="cuda")
    return x * torch.logspace(-4, 2, k, device="cuda")


@functools.cache
def quantized_weights(e, n, k, seed):
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    w = cancellation_rows(e * n, k, seed).reshape(e, n, k) if e else cancellation_rows(n, k, seed)
    mode = "per_expert" if e else "per_tensor"
    return w.to(torch.bfloat16), quantize_triton(w, block="16x16", global_scale=mode)


def on_grid_activation(x):
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    return quantize_triton(x, block="1x16", global_scale="per_row", out="ongrid")


def dense_row(name, m, n, k, cfg=None, splits=None) -> dict:
    from fp4_compile.codegen.nvfp4.decode_gemm_kernel import launch_decode_gemm
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm

    w, wq = quantized_weights(0, n, k, 5)
    x = cancellation_rows(m, k, 6).to(torch.bfloat16)
    a, gd_a = on_grid_activation(x)
    gd = wq.global_decode
    packed_bytes = n * k * (0.5 + 1 / 16)
    rp, rb = copies(int(packed_bytes)), copies(n * k * 2)
    packed = [(wq.codes.clone(), wq.block_scales.view(torch.uint8).clone()) for _ in range(rp)]
    bf16 = [w.clone() for _ in range(rb)]
    row = {"kind": "dense", "name": name, "M": m, "N": n, "K": k, "weight_copies": [rp, rb]}
    out = {"out_dtype": torch.bfloat16}
    row["bf16_ms"] = rotating_graph_ms(lambda b: F.linear(x, b), bf16)
    row["decode_ms"] = rotating_graph_ms(
        lambda p: launch_decode_gemm(a, gd_a, p, gd, **out, config=cfg, splits=splits), packed
    )
    if cfg is None and splits is None:
        row["old_packed_ms"] = rotating_graph_ms(
            lambda p: launch_gemm(a, gd_a, p, gd, **out, config_op="nvfp4_gemm"), packed
        )
        row["decode_eager_ms"] = flushed_ms(
            lambda: launch_decode_gemm(a, gd_a, packed[0], gd, **out)
        )
    row["weight_GBps"] = packed_bytes / row["decode_ms"] / 1e6
    row["vs_bf16"] = ratio(row["bf16_ms"], row["decode_ms"])
    return row


def grouped_row(name, e, n, k, per, cfg=None) -> dict:
    from fp4_compile.codegen.nvfp4.decode_gemm_kernel import launch_decode_gemm
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm

    w, wq = quantized_weights(e, n, k, 7)
    offs = (torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * per).to(torch.int32)
    x = cancellation_rows(e * per, k, 8).to(torch.bfloat16)
    a, gd_a = on_grid_activation(x)
    gd = wq.global_decode
    packed_bytes = e * n * k * (0.5 + 1 / 16)
    rp, rb = copies(int(packed_bytes)), copies(e * n * k * 2)
    packed = [(wq.codes.clone(), wq.block_scales.view(torch.uint8).clone()) for _ in range(rp)]
    w_kn = [w.clone().transpose(-1, -2) for _ in range(rb)]  # [E, K, N] views, as the learner
    row = {
        "kind": "grouped",
        "name": name,
        "E": e,
        "N": n,
        "K": k,
        "per_expert": per,
        "weight_copies": [rp, rb],
    }
    # eager with an L2 flush (its weights, 805 MB, exceed L2 anyway): torch._grouped_mm inside
    # the rotating CUDA graph hit a device-side offsets assert on the H200 (torch 2.11)
    row["bf16_ms"] = flushed_ms(lambda: torch._grouped_mm(x, w_kn[0], offs=offs))
    kw = {"out_dtype": torch.bfloat16, "offsets": offs, "rows_per_group": per}
    row["decode_ms"] = rotating_graph_ms(
        lambda p: launch_decode_gemm(a, gd_a, p, gd, **kw, config=cfg), packed
    )
    if cfg is None:
        row["old_packed_ms"] = rotating_graph_ms(
            lambda p: launch_gemm(a, gd_a, p, gd, **kw, config_op="nvfp4_gemm"), packed
        )
        row["decode_eager_ms"] = flushed_ms(
            lambda: launch_decode_gemm(a, gd_a, packed[0], gd, **kw)
        )
    row["weight_GBps"] = packed_bytes / row["decode_ms"] / 1e6
    row["vs_bf16"] = ratio(row["bf16_ms"], row["decode_ms"])
    return row
