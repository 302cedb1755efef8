"""The forward activations' per-row quantize in one launch (`codegen/row_quantize.py`) == the
two-step form (the per-row global stage, then the quantize kernel), bitwise: on-grid values and
global decodes, FP32 / BF16 / FP16 input, ragged K against the kernel's column tile, rows that
are all zeros, hold a NaN or an inf, tiny or huge values, a row stride wider than K, a 3-D
input; the Triton kernels in the interpreter here, on CUDA on the GPU."""

import os

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def qk():
    pytest.importorskip("triton")
    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen import quantize_kernel

    return quantize_kernel


def _rows(r, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, k, generator=g) * torch.logspace(-3, 3, r)[:, None]
    x[0] = 0.0
    x[1, 5] = float("nan")
    x[2, k // 2 + 1] = float("inf")
    x[3] = x[3] * 1e-30
    x[4, :16] = torch.tensor([-0.0, 0.0] * 8)
    return x.to(dtype)


def _both(qk, x):
    one = qk.quantize_triton(x, block="1x16", global_scale="per_row", out="ongrid")
    two = qk.quantize_triton(x, block="1x16", global_scale="per_row", out="ongrid",
                             one_launch_rows=False)  # fmt: skip
    return one, two


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])  # fmt: skip
@pytest.mark.parametrize("shape", [(37, 48), (9, 160), (70, 16)], ids=str)
def test_one_launch_equals_two_steps(qk, dtype, shape):
    x = _rows(*shape, dtype).to(DEV)
    (v1, gd1), (v2, gd2) = _both(qk, x)
    assert v1.shape == x.shape and gd1.shape == (shape[0], 1)
    assert_bitwise_equal(gd1, gd2, "global decode")
    assert_bitwise_equal(v1, v2, "on-grid values")


def test_strided_rows_and_3d_input(qk):
    wide = _rows(12, 96, torch.bfloat16, seed=3).to(DEV)
    x = wide[:, :64]  # row stride 96 > K = 64
    assert x.stride(0) == 96
    (v1, gd1), (v2, gd2) = _both(qk, x)
    assert_bitwise_equal(v1, v2, "strided on-grid")
    assert_bitwise_equal(gd1, gd2, "strided global decode")
    x3 = _rows(3 * 7, 32, torch.bfloat16, seed=4).reshape(3, 7, 32).to(DEV)
    (v1, gd1), (v2, gd2) = _both(qk, x3)
    assert v1.shape == (3, 7, 32) and gd1.shape == (3, 7, 1)
    assert_bitwise_equal(v1, v2, "3-D on-grid")
    assert_bitwise_equal(gd1, gd2, "3-D global decode")


def test_equals_the_reference(qk):
    """And the reference quantizer's on-grid values (its dequantize without the global scale)."""
    from fp4_compile import reference as ref
    from fp4_compile.format import decode_e2m1, unpack_codes

    x = _rows(20, 64, torch.float32, seed=5)[5:]  # finite rows only
    v, gd = qk.quantize_triton(x.to(DEV), block="1x16", global_scale="per_row", out="ongrid")
    q = ref.quantize(x, block="1x16", global_scale="per_row")
    assert_bitwise_equal(gd.cpu(), q.global_decode, "global decode")
    scales = q.block_scales.to(torch.float32).repeat_interleave(16, dim=-1)
    want = decode_e2m1(unpack_codes(q.codes)) * scales  # exact: <= 6 significant bits
    assert_bitwise_equal(v.float().cpu(), want, "on-grid values")


def test_bad_input(qk):
    from fp4_compile.codegen.row_quantize import quantize_rows_ongrid

    with pytest.raises(ValueError, match="K a multiple of 16"):
        quantize_rows_ongrid(torch.zeros(4, 24, device=DEV))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        quantize_rows_ongrid(torch.zeros(4, 32, dtype=torch.int32, device=DEV))
