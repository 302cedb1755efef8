"""The norms' and the dense SwiGLU's decode-GEMM codes left to the GEMM's prologue
(`nvfp4/norm_parts.py`, `nvfp4/silu_mul_parts.py`: rms_norm_quantize_parts /
silu_mul_quantize_parts + nvfp4_linear_parts) on the GPU, bitwise (the SwiGLU's == silu_mul_quantize
then nvfp4_linear_quantized likewise): == rms_norm_quantize /
add_rms_norm_quantize then nvfp4_linear_quantized (y, h and the product), at row counts inside
the decode buckets (the norm's first launch alone, the GEMM quantizing in its prologue), past
them (the codes' path) and with an on-grid weight (row_codes, then the GEMM). The engine with
the pass on == the learner: tests/gpu/test_gpu_alignment.py (the pass runs in every no-grad
bound graph). Rows of magnitudes 1e-3..1e3, a zero row, BF16."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

KEY = NVFP4Recipe.strict().numerics_key
ops = torch.ops.fp4_compile


def _inputs(m, h, n, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-3, 3, m)[:, None]
    x, r = (torch.randn(m, h, generator=g) * scale for _ in range(2))
    x[min(1, m - 1)] = 0.0
    r[min(1, m - 1)] = 0.0
    w = 1.0 + 0.1 * torch.randn(h, generator=g)
    wq = ref.quantize(torch.randn(n, h, generator=g), block="16x16").to("cuda")
    bias = torch.randn(n, generator=g).cuda()
    return [t.to(torch.bfloat16).cuda() for t in (x, r, w)], wq, bias


@pytest.mark.parametrize("ongrid", [False, True])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("m", [1, 2, 7, 16, 33, 64, 300])
def test_parts_ops_equal_norm_quantize_then_linear(m, residual, ongrid):
    (x, r, w), wq, bias = _inputs(m, 4096, 384, m)
    r = r if residual else None
    scales = wq.block_scales.view(torch.uint8)
    w_og = wq.on_grid(torch.bfloat16) if ongrid else None
    if r is None:
        y, a, gd, xt, gdt = ops.rms_norm_quantize(x, w, 1e-6, KEY, False)
        h = None
    else:
        y, a, gd, xt, gdt, h = ops.add_rms_norm_quantize(x, r, w, 1e-6, KEY, False)
    want = ops.nvfp4_linear_quantized(
        y, y, wq.codes, scales, wq.global_decode, bias, None, KEY, w_og, 0, a, gd, xt, gdt
    )
    y2, a2, gd2, parts, h2 = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
    got = ops.nvfp4_linear_parts(y2, a2, gd2, parts, wq.codes, scales, wq.global_decode, w_og, bias)
    assert_bitwise_equal(y2, y, f"y m={m}")
    if h is not None:
        assert_bitwise_equal(h2, h, f"h m={m}")
    assert_bitwise_equal(got, want, f"product m={m} residual={residual} ongrid={ongrid}")


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("m", [1, 2, 7, 16, 64, 300])
def test_silu_parts_equal_silu_mul_quantize_then_linear(m, masked):
    """The dense SwiGLU's form (`nvfp4/silu_mul_parts.py`): halves of one [M, 2C] tensor."""
    g = torch.Generator().manual_seed(m)
    c, n = 12288 // 4, 512
    x = (torch.randn(m, 2 * c, generator=g) * torch.logspace(-2, 2, m)[:, None]).bfloat16().cuda()
    a, b = x[:, :c], x[:, c:]
    mask = (torch.arange(m) % 2 == 1)[:, None].cuda() if masked else None
    wq = ref.quantize(torch.randn(n, c, generator=g), block="16x16").to("cuda")
    scales = wq.block_scales.view(torch.uint8)
    y, og, gd, xt, gdt = ops.silu_mul_quantize(a, b, mask, KEY, False)
    want = ops.nvfp4_linear_quantized(
        y, y, wq.codes, scales, wq.global_decode, None, None, KEY, None, 0, og, gd, xt, gdt
    )
    y2, og2, gd2, parts = ops.silu_mul_quantize_parts(a, b, mask, KEY)
    got = ops.nvfp4_linear_parts(
        y2, og2, gd2, parts, wq.codes, scales, wq.global_decode, None, None
    )
    assert_bitwise_equal(y2, y, f"y m={m}")
    assert_bitwise_equal(got, want, f"product m={m} masked={masked}")
