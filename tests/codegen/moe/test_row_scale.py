"""fp4_compile::row_scale: forward == the multiply; backward reduces in the written-out order
(the same bits whatever the leading shape); bad shapes are refused by name."""

import pytest
import torch

from fp4_compile import codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen import configs
from fp4_compile.codegen.invariant import fixed_order as im
from fp4_compile.codegen.moe.row_scale import BLOCK, row_scale
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


@pytest.mark.parametrize(
    "rows,h,dtype,wdtype",
    [
        (37, 2048, torch.bfloat16, torch.float32),
        (5, 200, torch.bfloat16, torch.bfloat16),
        (16, 40, torch.float32, torch.float32),
        (3, 64, torch.float16, torch.float32),
        (16, 128, torch.float32, torch.float32),
    ],
)
def test_backward_kernel_equals_the_torch_ops(rows, h, dtype, wdtype):
    """Bitwise: the one-pass Triton backward (CUDA's path; the interpreter here) == the torch
    ops, grad_x and grad_w, for H a multiple of the block, not one, and below it; rows past a
    program's 16; grad of x's dtype or FP32; cancellation-heavy products and all-negative-zero
    rows (the sum must keep -0.0 like the reference)."""
    from fp4_compile.codegen.moe.row_scale import row_scale_backward_reference
    from fp4_compile.codegen.moe.row_scale_kernel import row_scale_backward_triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(rows * h)
    x = (torch.randn(rows, h, generator=g) * torch.logspace(-4, 4, h)).to(dtype)
    grad = torch.randn(rows, h, generator=g).to(dtype if rows % 2 else torch.float32)
    grad[1] = -grad[1].abs()
    x[1] = x[1].abs()  # row 1: every product <= 0 ...
    x[1, : h // 2] = 0.0  # ... half of them -0.0
    grad[2], x[2] = -0.0, 1.0  # row 2: all products -0.0
    w = torch.rand(rows, 1, generator=g).to(wdtype)
    want = row_scale_backward_reference(grad.to(dev), x.to(dev), w.to(dev))
    got = row_scale_backward_triton(grad.to(dev), x.to(dev), w.to(dev))
    assert_bitwise_equal(got[0], want[0], "grad x")
    assert_bitwise_equal(got[1], want[1], "grad w")
    assert got[1].dtype == w.dtype and got[0].dtype == x.dtype
    if h % BLOCK == 0:  # (padding adds +0.0, which turns the sum to +0.0 otherwise)
        assert bool(torch.signbit(want[1][2]).all()), "the all -0.0 row is a case covered"


@pytest.mark.parametrize(
    "dtype,wdtype",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float16, torch.bfloat16),
    ],
)
def test_forward_kernel_equals_the_multiply(dtype, wdtype):
    """Bitwise: the Triton forward (CUDA's path; the interpreter here) == x * w, in the promoted
    dtype, with rows and columns past one program's tile and signed zeros."""
    from fp4_compile.codegen.moe.row_scale_kernel import row_scale_triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 19, 300, generator=g) * torch.logspace(-3, 3, 300)).to(dtype)
    x[0, 0] = -0.0
    w = (torch.rand(3, 19, 1, generator=g) - 0.5).to(wdtype)
    got = row_scale_triton(x.to(dev), w.to(dev))
    want = x.to(dev) * w.to(dev)
    assert got.dtype == want.dtype
    assert_bitwise_equal(got, want, "x * w")


@pytest.mark.parametrize(
    "most,rows,h", [(2, 5, 256), (4, 17, 512), (8, 3, 1024), (8, 4, 384), (4, 6, 200)]
)
@pytest.mark.parametrize("variant", ["plain", "row-mask", "grad-rows"])
def test_backward_blocks_per_step_keep_the_bits(monkeypatch, most, rows, h, variant):
    """Several 64-column blocks per loop step (`configs.LAUNCH`'s most_blocks, more bytes in flight) give
    the one-block kernel's bits, grad_x and grad_w: the block sums are still added one by one
    in block order (all -0.0 rows keep their sign). H = 384 with 8 per step takes 2 (the
    widest width dividing H), H = 200 takes 1."""
    from fp4_compile.codegen.moe import row_scale_kernel as rk

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(rows * h + most)
    x = (torch.randn(rows, h, generator=g) * torch.logspace(-4, 4, h)).to(torch.bfloat16)
    grad = torch.randn(rows, h, generator=g).to(torch.bfloat16)
    grad[1] = -grad[1].abs()
    x[1] = x[1].abs()
    x[1, : h // 2] = 0.0
    grad[2], x[2] = -0.0, 1.0
    w = torch.rand(rows, 1, generator=g)
    kw = {}
    if variant == "row-mask":
        kw = {"row_mask": torch.arange(rows) % 3 == 1}
    args = [grad, x, w, 64]
    if variant == "grad-rows":  # rows read grad[perm[r] // 1]
        kw = {"grad_rows": torch.randperm(rows, generator=g), "row_div": 1}
    args = [a.to(dev) if isinstance(a, torch.Tensor) else a for a in args]
    kw = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    key = (rk.arch_of(torch.device(dev)), "row_scale_backward")
    monkeypatch.setitem(configs.LAUNCH, key, {"block_r": 16, "num_warps": 4, "most_blocks": 1})
    want = rk.row_scale_backward_triton(*args, **kw)
    monkeypatch.setitem(configs.LAUNCH, key, {"block_r": 16, "num_warps": 4, "most_blocks": most})
    got = rk.row_scale_backward_triton(*args, **kw)
    assert_bitwise_equal(got[0], want[0], "grad x")
    assert_bitwise_equal(got[1], want[1], "grad w")
    assert rk.blocks_per_step(h, most) == {384: 2, 200: 1}.get(h, most)
    if variant == "plain" and h % 64 == 0:  # (padding adds +0.0 otherwise)
        assert bool(torch.signbit(want[1][2]).all()), "the all -0.0 row is a case covered"


def test_blocks_per_step_refuses_other_counts():
    from fp4_compile.codegen.moe.row_scale_kernel import blocks_per_step

    with pytest.raises(ValueError, match="blocks per step must be 1, 2, 4 or 8"):
        blocks_per_step(2048, 3)
