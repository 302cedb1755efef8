"""fp4_compile::add_rms_norm_quantize (a decoder layer's residual add fused into the norm that
reads it, with the norm's NVFP4 GEMM operand).

Tiers: bitwise (the op == `h = x + residual` then rms_norm_quantize: every output and h, in BF16
and FP32, and the gradients of x, residual and weight when h is read again; the Triton kernel's
residual form in the interpreter == the kernel on the summed rows, both launch forms);
integration (opcheck); bad input names the argument.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.testing import assert_bitwise_equal

STRICT = NVFP4Recipe.strict()
ops = torch.ops.fp4_compile
NAMES = ("y", "y on-grid", "y global decode", "y^T on-grid", "y^T global decode")


def _x(*shape, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("transposed", [True, False])
def test_fused_op_equals_add_then_norm_bitwise(dtype, transposed):
    """Every output and h == `x + residual` then rms_norm_quantize, bit for bit; then the
    gradients of x, residual and weight with h read again downstream (a residual stream), bit
    for bit (M = 3 x 7, rows of very different magnitude)."""
    scale = torch.logspace(-3, 3, 7)[None, :, None]
    x = (_x(3, 7, 64, seed=1) * scale).to(dtype).requires_grad_()
    r = (_x(3, 7, 64, seed=2) * scale).to(dtype).requires_grad_()
    w = (1.0 + 0.1 * _x(64, seed=3)).to(dtype).requires_grad_()
    fused = ops.add_rms_norm_quantize(x, r, w, 1e-6, STRICT.numerics_key, transposed)
    h = x + r
    unfused = ops.rms_norm_quantize(h, w, 1e-6, STRICT.numerics_key, transposed)
    for got, want, what in zip(fused, (*unfused, h), (*NAMES, "h")):
        assert_bitwise_equal(got, want, what)
    g, gh = _x(3, 7, 64, seed=4).to(dtype), _x(3, 7, 64, seed=5).to(dtype)
    got = torch.autograd.grad((fused[0] * g).sum() + (fused[5] * gh).sum(), (x, r, w))
    want = torch.autograd.grad((unfused[0] * g).sum() + (h * gh).sum(), (x, r, w))
    for a, b, what in zip(got, want, ("dx", "dresidual", "dweight")):
        assert_bitwise_equal(a, b, what)


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 4096), (3, 64), (21, 1040)])
def test_kernel_residual_form_interpreter(split, rows, hidden):
    """Bitwise (interpreter on CPU, compiled on CUDA): the kernel's residual form == the kernel
    on the summed rows (y, operand, global decode, row maxima) and its h == x + residual; both
    launch forms, M = 1 wide rows, H not a power of two."""
    from fp4_compile.codegen.nvfp4.rms_norm_quantize_kernel import (
        add_rms_norm_quantize,
        rms_norm_quantize,
    )

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    scale = torch.logspace(-2, 2, rows)[:, None]
    x = (_x(rows, hidden, seed=rows) * scale).to(dev)
    r = (_x(rows, hidden, seed=rows + 1) * scale).to(dev)
    w = (1.0 + 0.1 * _x(hidden, seed=6)).to(dev)
    got = add_rms_norm_quantize(x, r, w, 1e-6, split=split)
    want = rms_norm_quantize(x + r, w, 1e-6, split=split)
    for a, b, what in zip(got, want, ("y", "on-grid", "global decode", "row maxima")):
        assert_bitwise_equal(a, b, what)
    assert_bitwise_equal(got[4], x + r, "h")


def test_opcheck():
    """torch.library.opcheck: schema, fake tensors, autograd registration, aot dispatch."""
    x = _x(2, 5, 32, seed=6).requires_grad_()
    r = _x(2, 5, 32, seed=8).requires_grad_()
    w = (1.0 + 0.1 * _x(32, seed=7)).requires_grad_()
    for transposed in (True, False):
        args = (x, r, w, 1e-6, STRICT.numerics_key, transposed)
        torch.library.opcheck(ops.add_rms_norm_quantize.default, args)
    args = (x, r, None, 1e-6, STRICT.numerics_key, True)
    torch.library.opcheck(ops.add_rms_norm_quantize.default, args)


def test_bad_residual_names_the_argument():
    with pytest.raises(ValueError, match="residual"):
        ops.add_rms_norm_quantize(_x(4, 32), _x(4, 16), None, 1e-6, STRICT.numerics_key, False)
    with pytest.raises(ValueError, match="residual"):
        bf16 = _x(4, 32).bfloat16()
        ops.add_rms_norm_quantize(_x(4, 32), bf16, None, 1e-6, STRICT.numerics_key, False)
