"""`fp4_compile::moe_combine` (the MoE top-k combine as one op) == the four ops it replaces
(`row_scale`, `gather_rows`, a view, `ordered_sum`), bitwise, forward and backward: the CPU
implementation against the ops themselves, and the Triton kernels (the interpreter here, CUDA on
the GPU) against the CPU implementation; BF16 and FP32 results, mixed dtypes, a permutation and
an index with repeated and negative rows, signed zeros."""

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile.testing import assert_autograd_bitwise_equal, assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ops = torch.ops.fp4_compile


def _case(dtype_x, dtype_w, t=6, k=3, h=700, permutation=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = t * k
    x = (torch.randn(s, h, generator=g) * 3).to(dtype_x)
    x[0, :4] = torch.tensor([0.0, -0.0, 1e-30, -1e-30])
    w = torch.rand(s, 1, generator=g).to(dtype_w)
    if permutation:
        idx = torch.randperm(s, generator=g)
    else:  # repeated rows, a row never read, a negative (wrapping) index
        idx = torch.randint(0, s - 1, (s,), generator=g)
        idx[3] = -2
    return x, w, idx, k


def _four_ops(x, w, idx, k):
    y = ops.row_scale(x, w)
    y = ops.gather_rows(y, idx)
    return ops.ordered_sum(y.view(x.shape[0] // k, k, x.shape[1]), 1, False)


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
    ids=["bf16", "fp32", "mixed"],
)
@pytest.mark.parametrize("permutation", [True, False], ids=["perm", "repeats"])
def test_op_equals_the_four_ops(dtypes, permutation):
    """Forward and both gradients == the composition's autograd, bitwise (CPU: the reference
    implementations; CUDA: the kernels on both sides)."""
    x, w, idx, k = _case(*dtypes, permutation=permutation)
    x, w, idx = x.to(DEV), w.to(DEV), idx.to(DEV)  # CUDA: the kernels on both sides
    assert_autograd_bitwise_equal(
        lambda x_, w_: ops.moe_combine(x_, w_, idx, k),
        lambda x_, w_: _four_ops(x_, w_, idx, k),
        (x, w),
        "moe_combine vs the four ops",
    )


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
    ids=["bf16", "fp32", "mixed"],
)
@pytest.mark.parametrize("permutation", [True, False], ids=["perm", "repeats"])
def test_kernels_equal_the_reference(dtypes, permutation):
    """The forward kernel and the backward's slot-gradient sums (read through row // k) ==
    the CPU implementation, bitwise (CUDA, or the interpreter)."""
    pytest.importorskip("triton")
    import os

    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen.invariant.gather_rows_kernel import gather_rows_backward_triton
    from fp4_compile.codegen.moe.combine import moe_combine_reference, slot_grad_sums_reference
    from fp4_compile.codegen.moe.combine_kernel import moe_combine_triton

    x, w, idx, k = _case(*dtypes, permutation=permutation)
    out_dtype = torch.promote_types(x.dtype, w.dtype)
    got = moe_combine_triton(x.to(DEV), w.to(DEV), idx.to(DEV), k, out_dtype).cpu()
    assert_bitwise_equal(got, moe_combine_reference(x, w, idx, k), "forward")
    grad = torch.randn(x.shape[0] // k, x.shape[1], generator=torch.Generator().manual_seed(4))
    grad = grad.to(out_dtype)
    grad[0, :2] = torch.tensor([-0.0, 0.0])
    idx_w = torch.where(idx < 0, idx + x.shape[0], idx)  # gather_rows_backward's own wrap
    sums = gather_rows_backward_triton(grad.to(DEV), idx_w.to(DEV), x.shape[0], row_div=k).cpu()
    assert_bitwise_equal(sums, slot_grad_sums_reference(grad, idx, k), "slot gradient sums")


def test_bad_arguments_are_refused():
    x, w, idx, k = _case(torch.float32, torch.float32)
    with pytest.raises(ValueError, match="k must be a positive int dividing"):
        ops.moe_combine(x, w, idx, 4)
    with pytest.raises(ValueError, match=r"w floating \[S, 1\]"):
        ops.moe_combine(x, w.reshape(-1), idx, k)
    with pytest.raises(ValueError, match="idx int"):
        ops.moe_combine(x, w, idx.float(), k)


def test_opcheck():
    x, w, idx, k = _case(torch.bfloat16, torch.bfloat16, h=64)
    torch.library.opcheck(ops.moe_combine.default, (x.requires_grad_(), w.requires_grad_(), idx, k))


def _inverse_case(dtypes, masked, seed=0):
    x, w, idx, k = _case(*dtypes, seed=seed)
    inverse = torch.argsort(idx)  # idx[inverse[r]] == r
    grad = torch.randn(x.shape[0] // k, x.shape[1], generator=torch.Generator().manual_seed(7))
    grad = grad.to(torch.promote_types(x.dtype, w.dtype))
    grad[0, :3] = torch.tensor([-0.0, 0.0, -0.0])  # a slot sum starts at +0.0: -0.0 -> +0.0
    mask = None
    if masked:
        mask = torch.zeros(x.shape[0], dtype=torch.bool)
        mask[[1, 4]] = True
    return x, w, idx, k, inverse, grad, mask


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
    ids=["bf16", "fp32", "mixed"],
)
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "row-mask"])
def test_backward_through_the_inverse_equals_the_sorted_sums(dtypes, masked):
    """moe_combine_backward with idx_inverse (one term per slot sum, read in place) == without
    (the sorted position-ordered sums), bitwise, signed zeros included: CPU, and on CUDA the
    fused row_scale kernel against the sort + gather kernels."""
    x, w, idx, k, inverse, grad, mask = _inverse_case(dtypes, masked)
    dev = [t.to(DEV) if t is not None else None for t in (grad, x, w, idx, mask, inverse)]
    g, xd, wd, idd, md, inv = dev
    want = ops.moe_combine_backward(g, xd, wd, idd, k, md)
    got = ops.moe_combine_backward(g, xd, wd, idd, k, md, inv)
    assert_bitwise_equal(got[0], want[0], "grad_x")
    assert_bitwise_equal(got[1], want[1], "grad_w")
    token0_slots = got[0][idx[:k].to(DEV)].float().cpu()[:, :3]  # grad_x = g * w, w >= 0
    assert not token0_slots.signbit().any()  # the -0.0 gradients were read as +0.0
    assert_autograd_bitwise_equal(
        lambda x_, w_: ops.moe_combine(x_, w_, idd, k, md, inv),
        lambda x_, w_: ops.moe_combine(x_, w_, idd, k, md),
        (xd, wd),
        "moe_combine with vs without idx_inverse",
    )


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "row-mask"])
def test_fused_kernel_equals_the_reference(masked):
    """row_scale's backward kernel reading grad rows through inverse // k (CUDA, or the
    interpreter) == the CPU reference (slot sums, then row_scale's backward), bitwise."""
    pytest.importorskip("triton")
    import os

    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen.moe.combine import slot_grad_sums_reference
    from fp4_compile.codegen.moe.row_scale import row_scale_backward_reference
    from fp4_compile.codegen.moe.row_scale_kernel import row_scale_backward_triton

    for dtypes in [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)]:
        x, w, idx, k, inverse, grad, mask = _inverse_case(dtypes, masked, seed=3)
        g1 = slot_grad_sums_reference(grad, idx, k)
        want = row_scale_backward_reference(g1, x, w, mask)
        got = row_scale_backward_triton(
            grad.to(DEV),
            x.to(DEV),
            w.to(DEV),
            64,
            None if mask is None else mask.to(DEV),
            grad_rows=inverse.to(DEV),
            row_div=k,
        )
        assert_bitwise_equal(got[0].cpu(), want[0], f"grad_x {dtypes}")
        assert_bitwise_equal(got[1].cpu(), want[1], f"grad_w {dtypes}")


def test_a_wrong_inverse_is_refused():
    x, w, idx, k = _case(torch.float32, torch.float32)
    inverse = torch.argsort(idx)
    with pytest.raises(ValueError, match="inverse permutation of idx"):
        ops.moe_combine(x, w, idx, k, None, inverse.roll(1))
    with pytest.raises(ValueError, match=r"idx_inverse must be int \[S=18\]"):
        ops.moe_combine(x, w, idx, k, None, inverse[:-1])
    with pytest.raises(ValueError, match="inverse permutation of idx"):
        grad = torch.zeros(x.shape[0] // k, x.shape[1])
        ops.moe_combine_backward(grad, x, w, idx, k, None, inverse.flip(0))
    from fp4_compile.codegen.moe.row_scale_kernel import row_scale_backward_triton

    if DEV == "cuda":
        with pytest.raises(ValueError, match="grad_rows must be int32/int64"):
            row_scale_backward_triton(
                grad.cuda(), x.cuda(), w.cuda(), 64, grad_rows=inverse.cuda().float(), row_div=k
            )


def test_opcheck_with_inverse():
    x, w, idx, k = _case(torch.bfloat16, torch.bfloat16, h=64)
    torch.library.opcheck(
        ops.moe_combine.default,
        (x.requires_grad_(), w.requires_grad_(), idx, k, None, torch.argsort(idx)),
    )
