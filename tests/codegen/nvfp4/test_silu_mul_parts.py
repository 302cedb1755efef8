"""`fp4_compile::silu_mul_quantize_parts` (`nvfp4/silu_mul_parts.py`: the dense SwiGLU leaving
its down projection's codes to the decode GEMM's prologue) + `::nvfp4_linear_parts` against
`silu_mul_quantize` then `nvfp4_linear_quantized`.

Tier: bitwise (raw bytes). CPU: the references (and the chunk maxima against torch's). The
interpreter (the kernel path forced on CPU tensors, the interpreter made a decode architecture):
the SwiGLU's split form's first launch alone, then the GEMM quantizing in its prologue == the
SwiGLU kernel's split form (row_codes included), then the decode GEMM on its codes. Halves of
one [M, 2C] tensor (strided rows), a row mask, C not a multiple of the chunk (a tail)."""

import os

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal

KEY = NVFP4Recipe.strict().numerics_key
ops = torch.ops.fp4_compile
INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


def _inputs(m, c, n, masked, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 2 * c, generator=g) * torch.logspace(-2, 2, m)[:, None]
    a, b = x[:, :c], x[:, c:]
    mask = (torch.arange(m) % 2 == 1)[:, None] if masked else None
    wq = ref.quantize(torch.randn(n, c, generator=g), block="16x16")
    return a, b, mask, wq, torch.randn(n, generator=g)


def _linear_parts(y, a, gd, parts, wq, bias):
    scales = wq.block_scales.view(torch.uint8)
    return ops.nvfp4_linear_parts(y, a, gd, parts, wq.codes, scales, wq.global_decode, None, bias)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("c", [64, 208])
def test_cpu_equals_silu_mul_quantize_then_linear_bitwise(masked, c):
    a, b, mask, wq, bias = _inputs(5, c, 48, masked)
    y, og, gd, xt, gdt = ops.silu_mul_quantize(a, b, mask, KEY, False)
    scales = wq.block_scales.view(torch.uint8)
    want = ops.nvfp4_linear_quantized(
        y, y, wq.codes, scales, wq.global_decode, bias, None, KEY, None, 0, og, gd, xt, gdt
    )
    y2, og2, gd2, parts = ops.silu_mul_quantize_parts(a, b, mask, KEY)
    for got, exp, what in ((y2, y, "y"), (og2, og, "on-grid"), (gd2, gd, "global decode")):
        assert_bitwise_equal(got, exp, what)
    chunks = torch.nn.functional.pad(y.abs(), (0, -c % 128)).reshape(5, -1, 128)
    assert_bitwise_equal(parts, chunks.amax(dim=2), "chunk maxima")
    assert_bitwise_equal(_linear_parts(y2, og2, gd2, parts, wq, bias), want, "product")


@pytest.mark.skipif(not INTERP, reason="the kernel path in the interpreter (GPU: tests/gpu)")
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("m", "c"), [(1, 256), (3, 208)])
def test_kernel_path_equals_split_form_then_decode_gemm_bitwise(monkeypatch, masked, m, c):
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import gemm, norm_parts, silu_mul_parts
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize as kernel

    a, b, mask, wq, bias = _inputs(m, c, 48, masked, seed=m)
    scales = wq.block_scales.view(torch.uint8)
    monkeypatch.setattr(configs, "DECODE_DISPATCH", (*configs.DECODE_DISPATCH, "interpreter"))
    monkeypatch.setattr(norm_parts, "_kernels", lambda t: True)
    monkeypatch.setattr(silu_mul_parts, "_kernels", lambda t: True)
    y, og, gd, _ = kernel(a, b, mask, split=True)
    want = gemm.cuda_linear_quantized(
        og, gd, wq.codes, scales, wq.global_decode, None, bias, y.dtype
    )
    y2, _, _, parts = ops.silu_mul_quantize_parts(a, b, mask, KEY)
    assert parts.shape == (m, -(-c // 128))
    assert_bitwise_equal(y2, y, "y")
    assert_bitwise_equal(_linear_parts(y2, og, gd, parts, wq, bias), want, "product")


def test_opcheck():
    a, b, mask, _, _ = _inputs(3, 208, 48, True)
    torch.library.opcheck(ops.silu_mul_quantize_parts.default, (a, b, mask, KEY))
