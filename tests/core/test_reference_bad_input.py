"""Bad and edge input: each case gets a clear, specific answer (error naming the argument, or a
documented valid result)."""

import pytest
import torch

from fp4_compile import dequantize, nvfp4_grouped_mm, nvfp4_mm, quantize


def test_nan_reports_tensor_and_first_index():
    x = torch.ones(4, 32)
    x[2, 17] = float("nan")
    x[3, 0] = float("inf")
    with pytest.raises(ValueError, match=r"act contains NaN or Inf \(first at index \(2, 17\)"):
        quantize(x, name="act")


def test_inf_is_rejected():
    x = torch.ones(1, 16)
    x[0, 3] = float("-inf")
    with pytest.raises(ValueError, match=r"index \(0, 3\)"):
        quantize(x)


def test_last_dim_not_multiple_of_16():
    with pytest.raises(ValueError, match=r"multiple of 16.*\(3, 20\)"):
        quantize(torch.ones(3, 20))


def test_16x16_rows_not_multiple_of_16():
    with pytest.raises(ValueError, match=r"16x16.*\(20, 32\)"):
        quantize(torch.ones(20, 32), block="16x16")


def test_16x16_per_row_refused():
    with pytest.raises(ValueError, match="W and W\\^T"):
        quantize(torch.ones(16, 32), block="16x16", global_scale="per_row")


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.uint8])
def test_wrong_dtype(dtype):
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        quantize(torch.ones(2, 16).to(dtype))


def test_static_scale_dtype_and_device_mix():
    with pytest.raises(TypeError, match="static global_scale must be float32"):
        quantize(torch.ones(2, 16), global_scale=torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(TypeError, match="is on meta but x is on cpu"):
        quantize(torch.ones(2, 16), global_scale=torch.tensor(1.0, device="meta"))


def test_bad_mode_names():
    with pytest.raises(ValueError, match="global_scale must be"):
        quantize(torch.ones(2, 16), global_scale="per_block")
    with pytest.raises(ValueError, match="block must be"):
        quantize(torch.ones(2, 16), block="32x32")
    with pytest.raises(ValueError, match="rounding must be"):
        quantize(torch.ones(2, 16), rounding="floor")
    with pytest.raises(ValueError, match="needs an integer seed"):
        quantize(torch.ones(2, 16), rounding="stochastic")


@pytest.mark.parametrize("shape", [(0, 16), (3, 0), (0,)])
@pytest.mark.parametrize("mode", ["per_tensor", "per_row"])
def test_empty_tensors_are_valid(shape, mode):
    x = torch.empty(shape)
    q = quantize(x, global_scale=mode)
    assert q.shape == shape
    out = dequantize(q)
    assert out.shape == shape and out.numel() == 0


def test_all_zero_blocks_give_zero_scale_and_zeros():
    x = torch.zeros(3, 32)
    x[0, 20] = 5.0  # row 0, block 1 non-zero; everything else zero
    for mode in ("per_tensor", "per_row"):
        q = quantize(x, global_scale=mode)
        assert q.block_scales[0, 0].float().item() == 0.0
        assert q.block_scales[1].float().eq(0).all()
        out = dequantize(q)
        assert torch.isfinite(out).all() and torch.isfinite(q.global_decode).all()
        assert out[1:].eq(0).all() and out[0, :16].eq(0).all()


def test_all_zero_tensor():
    q = quantize(torch.zeros(2, 16))
    assert torch.isfinite(q.global_decode).all()
    assert dequantize(q).eq(0).all() and q.codes.eq(0).all()


def test_static_scale_overflowing_e4m3_range_saturates():
    """A static amax far below the data saturates the block scale at 448 and the codes at 6,
    never producing NaN."""
    x = torch.tensor([[100.0] + [1.0] * 15])
    q = quantize(x, global_scale=torch.tensor(1.0))
    assert q.block_scales.float().item() == 448.0
    assert q.unpacked_codes()[0, 0].item() == 7
    assert torch.isfinite(dequantize(q)).all()


def test_subnormal_block_scales():
    x = torch.zeros(1, 32)
    x[0, 0] = 1000.0
    x[0, 16:] = 1e-2  # block 1 scale = 1e-2 * 448 / 1000 = 4.5e-3 -> subnormal E4M3
    q = quantize(x, global_scale="per_tensor")
    s = q.block_scales[0, 1].float().item()
    assert 0 < s < 2**-6, s
    out = dequantize(q)
    assert torch.isfinite(out).all() and (out[0, 16:] > 0).all()


def test_negative_zero():
    x = torch.zeros(1, 16)
    x[0, 0] = 6.0
    x[0, 1] = -0.0
    x[0, 2] = -0.1  # rounds to magnitude 0 but keeps its sign: code 8
    codes = quantize(x).unpacked_codes()[0]
    assert codes[1].item() == 0 and codes[2].item() == 8


def test_gemm_operand_checks():
    a = quantize(torch.ones(2, 32))
    b = quantize(torch.ones(16, 16), block="16x16")
    with pytest.raises(ValueError, match="contraction dims differ"):
        nvfp4_mm(a, b)
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        nvfp4_mm(torch.ones(2, 32), b)


def test_grouped_offsets_checks():
    from fp4_compile import quantize_experts

    a = quantize(torch.ones(4, 16))
    w = quantize_experts(torch.ones(2, 16, 16))
    with pytest.raises(TypeError, match="int32"):
        nvfp4_grouped_mm(a, w, torch.tensor([2, 4]))
    with pytest.raises(ValueError, match="offsets\\[-1\\] == T=4"):
        nvfp4_grouped_mm(a, w, torch.tensor([2, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="non-decreasing"):
        nvfp4_grouped_mm(a, w, torch.tensor([3, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="shape \\[2\\]"):
        nvfp4_grouped_mm(a, w, torch.tensor([4], dtype=torch.int32))
