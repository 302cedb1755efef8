"""Reference GEMMs. Bitwise: order independence, grouped == per-expert loop. Error budget:
against the float64 product of the original (unquantized) inputs, an SQNR floor."""

import torch

from fp4_compile import nvfp4_grouped_mm, nvfp4_mm, quantize, quantize_experts
from fp4_compile.reference import exact_dot_fp32
from fp4_compile.testing import assert_bitwise_equal, sqnr_db


def test_exact_dot_is_order_independent():
    g = torch.Generator().manual_seed(0)
    a = quantize(torch.randn(8, 4096, generator=g), global_scale="per_row")
    b = quantize(torch.randn(32, 4096, generator=g), block="16x16")
    perm = torch.randperm(4096 // 16, generator=g)
    # Permute whole 16-blocks of both operands (the same permutation): the dot products are the
    # same sums in another order, and exact arithmetic gives identical bits.
    from fp4_compile.format import NVFP4Tensor

    def permute_blocks(t: NVFP4Tensor) -> NVFP4Tensor:
        codes = t.codes.reshape(t.codes.shape[0], -1, 8)[:, perm].reshape(t.codes.shape)
        scales = t.block_scales[:, perm]
        return NVFP4Tensor(
            codes=codes.contiguous(),
            block_scales=scales.contiguous(),
            global_decode=t.global_decode,
            shape=t.shape,
            block=t.block,
        )

    assert_bitwise_equal(exact_dot_fp32(a, b), exact_dot_fp32(permute_blocks(a), permute_blocks(b)))


def test_nvfp4_mm_rows_independent_of_batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g)
    w = quantize(torch.randn(48, 256, generator=g), block="16x16")
    full = nvfp4_mm(quantize(x, global_scale="per_row"), w)
    for m in (1, 3, 17):
        part = nvfp4_mm(quantize(x[5 : 5 + m], global_scale="per_row"), w)
        assert_bitwise_equal(part, full[5 : 5 + m], f"rows 5..{5 + m}")


def test_nvfp4_mm_sqnr_floor_vs_float64():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(128, 512, generator=g), torch.randn(256, 512, generator=g) * 0.05
    y = nvfp4_mm(quantize(x, global_scale="per_row"), quantize(w, block="16x16"))
    # two 4-bit operands: ~19-20 dB each, ~16-17 dB for the product; floor well under that
    assert sqnr_db(x.double() @ w.double().T, y) > 15.0


def test_grouped_equals_per_expert_loop_bitwise():
    g = torch.Generator().manual_seed(3)
    num_experts, n, k = 4, 32, 64
    x = torch.randn(10, k, generator=g)
    w = torch.randn(num_experts, n, k, generator=g)
    offsets = torch.tensor([3, 3, 9, 10], dtype=torch.int32)  # expert 1 empty
    xq = quantize(x, global_scale="per_row")
    wq = quantize_experts(w)
    out = nvfp4_grouped_mm(xq, wq, offsets)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            expected = nvfp4_mm(xq[start:end], quantize(w[e], block="16x16"))
            assert_bitwise_equal(out[start:end], expected, f"expert {e}")
        start = end


def test_grouped_handles_gate_up_and_down_shapes():
    g = torch.Generator().manual_seed(4)
    hidden, inter, num_experts = 32, 48, 3
    x = torch.randn(7, hidden, generator=g)
    gate_up = quantize_experts(torch.randn(num_experts, 2 * inter, hidden, generator=g))
    down = quantize_experts(torch.randn(num_experts, hidden, inter, generator=g))
    offs = torch.tensor([2, 5, 7], dtype=torch.int32)
    h = nvfp4_grouped_mm(quantize(x, global_scale="per_row"), gate_up, offs)
    assert h.shape == (7, 2 * inter)
    y = nvfp4_grouped_mm(quantize(h[:, :inter].contiguous(), global_scale="per_row"), down, offs)
    assert y.shape == (7, hidden) and torch.isfinite(y).all()
