"""The MoE block's decode-GEMM codes left to the experts' GEMMs (`nvfp4/grouped_parts.py`:
rms_norm_quantize_parts / silu_mul_quantize_parts + nvfp4_grouped_mm_parts) on the GPU,
bitwise: == add_rms_norm_quantize then nvfp4_grouped_mm_quantized on the tokens gathered by
expert order (y, h and the gate/up product), and == silu_mul_halves_quantize then
nvfp4_grouped_mm_quantized on that product's halves (y and the down product), at token counts
inside the decode buckets (the producer's first launch alone, the decode GEMM quantizing each
gathered row in its prologue), past them (the codes' path) and with an on-grid weight
(row_codes, then the GEMM). Qwen3-30B-A3B's hidden 2048 and moe_intermediate 768 over 16
experts, top-4 (every expert's rows in the decode buckets at few tokens), and its 128 experts,
top-8 (the SwiGLU's rows past the buckets, the rows per expert within them). The engine with the
pass on == the learner: tests/gpu/test_gpu_alignment.py. Rows of magnitudes 1e-3..1e3, a zero
row, BF16."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

KEY = NVFP4Recipe.strict().numerics_key
ops = torch.ops.fp4_compile
HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 16, 4


def _routing(m, g, dev, e=EXPERTS, top_k=TOP_K):
    """(x_index int32 [m * top_k]: the tokens in expert order, offsets int32 [E]: the ends)."""
    experts = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)])
    order = torch.argsort(experts.reshape(-1), stable=True)
    index = (order // top_k).to(torch.int32)
    ends = torch.bincount(experts.reshape(-1), minlength=e).cumsum(0).to(torch.int32)
    return index.to(dev), ends.to(dev)


def _experts(n, k, g, dev, e=EXPERTS):
    w = torch.randn(e, n, k, generator=g) * torch.logspace(-2, 1, k // 16).repeat_interleave(16)
    wq = ref.quantize_experts(w).to(dev)
    return (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode), wq


def _inputs(m, g, dev):
    scale = torch.logspace(-3, 3, m)[:, None]
    x, r = (torch.randn(m, HIDDEN, generator=g) * scale for _ in range(2))
    x[min(1, m - 1)] = 0.0
    r[min(1, m - 1)] = 0.0
    w = 1.0 + 0.1 * torch.randn(HIDDEN, generator=g)
    return [t.to(torch.bfloat16).to(dev) for t in (x, r, w)]


def check_moe_block(m, ongrid, dev="cuda", e=EXPERTS, top_k=TOP_K):
    """The norm -> gate/up and SwiGLU -> down pairs, new ops vs old, bitwise (the SwiGLU and
    the down GEMM with groups = E, as passes/defer_decode_codes.py sets them)."""
    g = torch.Generator().manual_seed(m)
    x, r, w = _inputs(m, g, dev)
    index, offsets = _routing(m, g, dev, e, top_k)
    up, up_q = _experts(2 * INTER, HIDDEN, g, dev, e)
    down, down_q = _experts(HIDDEN, INTER, g, dev, e)
    up_og = up_q.on_grid(torch.bfloat16) if ongrid else None
    down_og = down_q.on_grid(torch.bfloat16) if ongrid else None

    y, a, gd, _, _, h = ops.add_rms_norm_quantize(x, r, w, 1e-6, KEY, False)
    want = ops.nvfp4_grouped_mm_quantized(
        y, y, *up, offsets, None, KEY, up_og, 0, index, None, a, gd
    )
    y2, a2, gd2, parts, h2 = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
    got = ops.nvfp4_grouped_mm_parts(y2, a2, gd2, parts, *up, up_og, offsets, index)
    assert_bitwise_equal(y2, y, f"y m={m}")
    assert_bitwise_equal(h2, h, f"h m={m}")
    assert_bitwise_equal(got, want, f"gate/up m={m} ongrid={ongrid}")

    s, sa, sgd = ops.silu_mul_halves_quantize(want, None, KEY)
    want = ops.nvfp4_grouped_mm_quantized(
        s, s, *down, offsets, None, KEY, down_og, 0, None, None, sa, sgd
    )
    gate, up_half = got[:, :INTER], got[:, INTER:]  # the gate/up product's halves (strided)
    s2, sa2, sgd2, sparts = ops.silu_mul_quantize_parts(gate, up_half, None, KEY, e)
    got = ops.nvfp4_grouped_mm_parts(s2, sa2, sgd2, sparts, *down, down_og, offsets, None, e)
    assert_bitwise_equal(s2, s, f"SwiGLU m={m}")
    assert_bitwise_equal(got, want, f"down m={m} ongrid={ongrid}")


@pytest.mark.parametrize("ongrid", [False, True])
@pytest.mark.parametrize("m", [1, 2, 7, 16, 64, 300])
def test_grouped_parts_equal_old_ops(m, ongrid):
    check_moe_block(m, ongrid)


@pytest.mark.parametrize("ongrid", [False, True])
@pytest.mark.parametrize("m", [64, 96])
def test_qwen3_moe_routing_swiglu_rows_past_buckets(m, ongrid):
    """Qwen3-30B-A3B's 128 experts, top-8: at 64 tokens the SwiGLU's 512 rows are past the
    decode buckets but its down GEMM's rows per expert (4) are not: the prologue path (issue
    53's batch-64 launch); at 96 tokens (768 rows, 6 per expert) too."""
    check_moe_block(m, ongrid, e=128, top_k=8)
