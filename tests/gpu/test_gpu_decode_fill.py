"""Decode-size calls fill the GPU and keep every bit (issue 53), on the GPU (compiled Triton
kernels), at Qwen3-8B's widths (hidden 4096, MLP 12288, vocabulary 151936).

Bitwise:
- the split forms of the fused quantize kernels and of the per-row quantize (few rows: maxima
  over column chunks, then `row_codes_kernel`) == the same rows inside a call of many rows (the
  one-launch forms), and the forced one-launch form at M = 1;
- the Gumbel-noise kernel's noise == the torch form it replaced, on the same device.
"""

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
MANY = 2048  # rows of the one-launch reference calls (above every split_rows_below)


def _randn(*shape, seed, scale=1.0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEVICE) * scale


@pytest.mark.parametrize("rows", [1, 3, 64, 300])
def test_silu_mul_quantize_few_rows_equal_many_rows(rows):
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize

    x = _randn(MANY, 2 * 12288, seed=1, scale=2.0).to(torch.bfloat16)
    a, b = x[:, :12288], x[:, 12288:]
    full = silu_mul_quantize(a, b)
    part = silu_mul_quantize(a[:rows], b[:rows])
    for got, want, what in zip(part, full, ("y", "on-grid", "gd", "row maxima")):
        assert_bitwise_equal(got, want[:rows], f"{what}: {rows} rows alone vs in {MANY}")
    if rows == 1:
        whole = silu_mul_quantize(a[:1], b[:1], split=False)
        for got, want, what in zip(part, whole, ("y", "on-grid", "gd", "row maxima")):
            assert_bitwise_equal(got, want, f"{what}: split vs one launch")


@pytest.mark.parametrize("rows", [1, 7, 200])
def test_rms_norm_quantize_few_rows_equal_many_rows(rows):
    from fp4_compile.codegen.nvfp4.rms_norm_quantize_kernel import rms_norm_quantize

    x = (_randn(MANY, 4096, seed=2) * _randn(MANY, 1, seed=3).exp()).to(torch.bfloat16)
    w = (1.0 + 0.1 * _randn(4096, seed=4)).to(torch.bfloat16)
    full = rms_norm_quantize(x, w, 1e-6)
    part = rms_norm_quantize(x[:rows], w, 1e-6)
    for got, want, what in zip(part, full, ("y", "on-grid", "gd", "row maxima")):
        assert_bitwise_equal(got, want[:rows], f"{what}: {rows} rows alone vs in {MANY}")


@pytest.mark.parametrize("rows", [1, 5, 100])
def test_per_row_quantize_few_rows_equal_many_rows(rows):
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    x = (_randn(MANY, 4096, seed=5) * _randn(MANY, 1, seed=6).exp()).to(torch.bfloat16)
    full = quantize_triton(x, block="1x16", global_scale="per_row", out="ongrid")
    part = quantize_triton(x[:rows], block="1x16", global_scale="per_row", out="ongrid")
    for got, want, what in zip(part, full, ("on-grid", "gd")):
        assert_bitwise_equal(got, want[:rows], f"{what}: {rows} rows alone vs in {MANY}")


def test_gumbel_noise_kernel_equals_torch_form():
    from fp4_compile.rollout.sampling import gumbel_noise, gumbel_uniforms_reference

    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2**32, (16,), generator=g).to(DEVICE)
    for step in (0, 1, 17, 511, 2**31 + 3):
        counter = torch.tensor(step, dtype=torch.int64, device=DEVICE)
        u = gumbel_uniforms_reference(keys, counter, 151936)
        want = (-torch.log(-torch.log(u))).to(torch.float32)
        assert_bitwise_equal(gumbel_noise(keys, counter, 151936), want, f"noise at {step}")
        assert_bitwise_equal(gumbel_noise(keys, step, 151936), want, f"host step {step}")
