"""fp4_compile::row_scale: forward == the multiply; backward reduces in the written-out order
(the same bits whatever the leading shape); bad shapes are refused by name."""

import pytest
import torch

from fp4_compile import codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen import invariant_math as im
from fp4_compile.codegen.row_scale import BLOCK, row_scale
from fp4_compile.testing import assert_bitwise_equal


def _xw(rows=12, h=200, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h, generator=g).to(dtype).requires_grad_()
    w = torch.rand(rows, 1, generator=g).requires_grad_()
    return x, w


def test_forward_is_the_multiply_and_backward_is_ordered():
    x, w = _xw()
    y = row_scale(x, w)
    assert_bitwise_equal(y, x.detach() * w.detach(), "forward")
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    y.backward(grad)
    want_w = im.block_sum(grad * x.detach().float(), BLOCK)[..., None]
    assert_bitwise_equal(w.grad, want_w, "grad w")
    assert_bitwise_equal(x.grad, (grad * w.detach()).to(x.dtype), "grad x")


def test_rows_alone_equal_rows_in_batch():
    x, w = _xw(rows=9, h=2048)
    grad = torch.randn(9, 2048, generator=torch.Generator().manual_seed(2))
    row_scale(x, w).backward(grad)
    for i in (0, 4, 8):
        xi = x.detach()[i : i + 1].clone().requires_grad_()
        wi = w.detach()[i : i + 1].clone().requires_grad_()
        row_scale(xi, wi).backward(grad[i : i + 1])
        assert_bitwise_equal(wi.grad, w.grad[i : i + 1], f"row {i}")


def test_opcheck():
    x, w = _xw(rows=4, h=32, dtype=torch.float32)
    torch.library.opcheck(torch.ops.fp4_compile.row_scale.default, (x, w))


def test_bad_shapes_are_named():
    x, _ = _xw()
    with pytest.raises(ValueError, match="row_scale needs w"):
        row_scale(x, torch.ones(12, 2))
    with pytest.raises(TypeError, match="floating"):
        row_scale(x, torch.ones(12, 1, dtype=torch.int64))
