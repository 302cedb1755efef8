"""The row masks folded into `silu_mul` and `moe_combine` (`passes/fold_row_masks.py`): each op
with `row_mask` == the op on `x.masked_fill(row_mask, 0)`, forward and every gradient through
the masked_fill, bitwise; the Triton kernels (CUDA, or the interpreter here) == the CPU
implementation. Masked rows hold NaN and inf (they must not leak), and so do their gradients."""

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile.testing import assert_autograd_bitwise_equal, assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ops = torch.ops.fp4_compile


def _gate_up(dtype, rows=37, cols=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 2 * cols, generator=g) * 3).to(dtype)
    mask = torch.zeros(rows, 1, dtype=torch.bool)
    mask[[1, 4, rows - 1]] = True
    x[1, 3], x[4, cols + 2], x[rows - 1, 0] = float("nan"), float("inf"), -float("inf")
    x[0, :2] = torch.tensor([0.0, -0.0])
    return x, mask


def _swiglu_grads(x, mask, grad, folded):
    x = x.clone().requires_grad_()
    if folded:
        a, b = x.chunk(2, dim=-1)
        out = ops.silu_mul(a, b, mask)
    else:
        a, b = x.masked_fill(mask, 0.0).chunk(2, dim=-1)
        out = ops.silu_mul(a, b)
    out.backward(grad)
    return out.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_mul_row_mask_is_the_masked_fill(dtype):
    x, mask = _gate_up(dtype)
    x, mask = x.to(DEV), mask.to(DEV)
    grad = torch.randn(x.shape[0], x.shape[1] // 2, generator=torch.Generator().manual_seed(1))
    grad = grad.to(dtype).to(DEV)
    grad[4, 5] = float("nan")  # a masked row's incoming gradient: still +0.0 out
    got = _swiglu_grads(x, mask, grad, folded=True)
    want = _swiglu_grads(x, mask, grad, folded=False)
    assert_bitwise_equal(got[0], want[0], "forward")
    assert_bitwise_equal(got[1], want[1], "grad x")
    assert not torch.isnan(got[1][4]).any() and torch.isnan(got[0]).sum() == 0


def test_silu_mul_kernels_with_row_mask_equal_the_kernels_on_masked_inputs():
    """The masked launches == the unmasked launches on the masked copy's halves (the unfolded
    graph's kernels on the same device: CUDA, or the interpreter here with bf16, whose rounding
    absorbs numpy's exp), NaN and inf in the masked rows of the inputs and of the gradient."""
    import os

    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen.invariant.silu_mul_kernel import (
        silu_mul_backward_triton,
        silu_mul_triton,
    )

    for dtype in (torch.bfloat16,) + ((torch.float32,) if DEV == "cuda" else ()):
        x, mask = _gate_up(dtype)
        x, mask = x.to(DEV), mask.to(DEV)
        a, b = x.chunk(2, dim=-1)
        am, bm = x.masked_fill(mask, 0.0).chunk(2, dim=-1)
        grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEV)
        grad[1, 0] = float("inf")
        assert_bitwise_equal(silu_mul_triton(a, b, mask), silu_mul_triton(am, bm), "forward")
        got = silu_mul_backward_triton(grad, a, b, mask)
        want = [g.masked_fill(mask, 0.0) for g in silu_mul_backward_triton(grad, am, bm)]
        assert_bitwise_equal(got[0], want[0], f"{dtype} grad a")
        assert_bitwise_equal(got[1], want[1], f"{dtype} grad b")


def _combine_case(dtype_x, dtype_w, t=6, k=3, h=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = t * k
    x = (torch.randn(s, h, generator=g) * 3).to(dtype_x)
    w = torch.rand(s, 1, generator=g).to(dtype_w)
    idx = torch.randperm(s, generator=g)
    mask = torch.zeros(s, 1, dtype=torch.bool)
    mask[[0, 5, s - 1]] = True
    x[5, 7], x[s - 1, 0] = float("nan"), float("inf")
    return x, w, idx, k, mask


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
    ids=["bf16", "fp32", "mixed"],
)
def test_moe_combine_row_mask_is_the_masked_fill(dtypes):
    """Forward and both gradients == moe_combine of the masked_fill's output, bitwise (CPU: the
    reference implementations; CUDA: the kernels on both sides)."""
    x, w, idx, k, mask = _combine_case(*dtypes)
    x, w, idx, mask = x.to(DEV), w.to(DEV), idx.to(DEV), mask.to(DEV)
    y = assert_autograd_bitwise_equal(
        lambda x_, w_: ops.moe_combine(x_, w_, idx, k, mask),
        lambda x_, w_: ops.moe_combine(x_.masked_fill(mask, 0.0), w_, idx, k),
        (x, w),
        "moe_combine row_mask vs masked_fill",
    )
    assert not torch.isnan(y).any()


def test_moe_combine_kernels_with_row_mask_equal_the_kernels_on_masked_inputs():
    """The masked forward and row_scale backward launches == the unmasked ones on the masked
    copy (then masked_fill's backward on grad_x), on one device (CUDA, or the interpreter), a
    NaN slot gradient in a masked row included; and == the CPU implementation where no NaN
    is involved (NaN bit patterns are not the same across CPU and CUDA)."""
    import os

    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen.moe.combine import moe_combine_reference
    from fp4_compile.codegen.moe.combine_kernel import moe_combine_triton
    from fp4_compile.codegen.moe.row_scale import row_scale_backward_reference
    from fp4_compile.codegen.moe.row_scale_kernel import row_scale_backward_triton

    for dtypes in ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)):
        x, w, idx, k, mask = _combine_case(*dtypes)
        out_dtype = torch.promote_types(x.dtype, w.dtype)
        xd, wd, idxd, md = x.to(DEV), w.to(DEV), idx.to(DEV), mask.to(DEV)
        xm = xd.masked_fill(md, 0.0)
        got = moe_combine_triton(xd, wd, idxd, k, out_dtype, md)
        assert_bitwise_equal(got, moe_combine_triton(xm, wd, idxd, k, out_dtype), "forward")
        assert_bitwise_equal(got.cpu(), moe_combine_reference(x, w, idx, k, mask), "forward, CPU")
        g1 = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(x.dtype)
        got = row_scale_backward_triton(g1.to(DEV), xd, wd, 64, md)
        want = row_scale_backward_reference(g1, x, w, mask)
        assert_bitwise_equal(got[0].cpu(), want[0], "grad x, CPU")
        assert_bitwise_equal(got[1].cpu(), want[1], "grad w, CPU")
        g1[0, 0] = float("nan")  # a masked row's slot gradient: its grad_x is still +0.0
        g1d = g1.to(DEV)
        got = row_scale_backward_triton(g1d, xd, wd, 64, md)
        gx, gw = row_scale_backward_triton(g1d, xm, wd, 64)
        assert_bitwise_equal(got[0], gx.masked_fill(md, 0.0), "grad x")
        assert_bitwise_equal(got[1], gw, "grad w")


def test_bad_row_masks_are_refused():
    x, mask = _gate_up(torch.float32, rows=5, cols=8)
    a, b = x.chunk(2, dim=-1)
    with pytest.raises(ValueError, match="row_mask must be bool"):
        ops.silu_mul(a, b, mask.float())
    with pytest.raises(ValueError, match="row_mask must be bool"):
        ops.silu_mul(a, b, mask[:3])
    xc, w, idx, k, cmask = _combine_case(torch.float32, torch.float32)
    with pytest.raises(ValueError, match="row_mask must be bool"):
        ops.moe_combine(xc, w, idx, k, cmask[:4])


def test_opchecks_with_row_masks():
    x, mask = _gate_up(torch.float32, rows=5, cols=8)
    x = x.nan_to_num()
    a, b = x.chunk(2, dim=-1)
    torch.library.opcheck(ops.silu_mul.default, (a.contiguous(), b.contiguous(), mask))
    xc, w, idx, k, cmask = _combine_case(torch.bfloat16, torch.bfloat16, h=64)
    torch.library.opcheck(
        ops.moe_combine.default,
        (xc.nan_to_num().requires_grad_(), w.requires_grad_(), idx, k, cmask),
    )
