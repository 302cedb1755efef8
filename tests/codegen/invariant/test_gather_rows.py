"""fp4_compile::gather_rows: forward == x[idx]; backward sums each row's gradients in position
order, in FP32, one definition on every device (the Triton pass bitwise the torch ops); rows
keep their sums when other rows join the batch; bad operands are refused by name."""

import pytest
import torch

from fp4_compile.codegen.invariant.gather_rows import gather_rows
from fp4_compile.codegen.invariant.reference import gather_rows_backward_reference
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _moe_index(tokens: int, top_k: int, experts: int, seed: int) -> torch.Tensor:
    """perm // top_k of the experts' sort by expert: every token top_k times."""
    g = torch.Generator().manual_seed(seed)
    expert_ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    perm = torch.sort(expert_ids.reshape(-1), stable=True).indices
    return perm // top_k


def _grad(p: int, c: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(p, c, generator=g) * torch.logspace(-4, 4, c)
    t[0] = -0.0  # signed zeros: 0.0 + (-0.0) is +0.0 in both
    return t.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("case", ["moe", "permutation", "sparse", "negative"])
def test_backward_kernel_equals_the_torch_ops(dtype, case):
    """Bitwise: the Triton backward (CUDA's path; the interpreter here) == the torch ops, with
    duplicates (every token top-k times), a permutation, rows no position names, negative
    indices; columns past one tile, rows past a program's."""
    from fp4_compile.codegen.invariant.gather_rows_kernel import gather_rows_backward_triton

    rows, c = 13, 700
    if case == "moe":
        idx = _moe_index(rows, 4, 8, seed=1)
    elif case == "permutation":
        idx = torch.randperm(rows, generator=torch.Generator().manual_seed(2))
    elif case == "sparse":
        idx = torch.tensor([3, 3, 11, 0, 3, 11])
    else:
        idx = torch.tensor([-1, 2, -13, 12, 0, 0])
    grad = _grad(idx.shape[0], c, dtype, seed=3)
    want = gather_rows_backward_reference(grad.to(DEV), idx.to(DEV), rows)
    got = gather_rows_backward_triton(grad.to(DEV), idx.to(DEV), rows)
    assert got.dtype == dtype and got.shape == (rows, c)
    assert_bitwise_equal(got, want, f"grad x ({case})")
    if case == "sparse":
        assert not want[1].any() and not want[12].any()


def test_reference_is_the_written_out_sum():
    """The definition: grad_x[r] = ((0.0 + g[p0]) + g[p1]) + ..., FP32, positions ascending."""
    idx = torch.tensor([2, 0, 2, 2])
    grad = torch.tensor([[1.0], [5.0], [2.0**-24], [3.0]]).to(torch.float32)
    got = gather_rows_backward_reference(grad, idx, 3)
    want = torch.tensor([[5.0], [0.0], [((0.0 + 1.0) + 2.0**-24) + 3.0]])
    assert_bitwise_equal(got, want, "written-out sums")


def test_op_forward_backward_and_compile():
    idx = _moe_index(9, 2, 4, seed=4)
    x = torch.randn(9, 3, 40, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    grad = torch.randn(idx.shape[0], 3, 40).to(torch.bfloat16)
    outs = []
    for fn in (gather_rows, torch.compile(gather_rows, backend="inductor", fullgraph=True)):
        xi = x.clone().requires_grad_(True)
        y = fn(xi, idx)
        assert_bitwise_equal(y, x[idx], "forward == x[idx]")
        y.backward(grad)
        outs.append(xi.grad)
    want = gather_rows_backward_reference(grad.reshape(idx.shape[0], -1), idx, 9).reshape(9, 3, 40)
    assert_bitwise_equal(outs[0], want, "eager backward")
    assert_bitwise_equal(outs[1], want, "compiled backward")
    torch.library.opcheck(torch.ops.fp4_compile.gather_rows.default, (x.float(), idx))


def test_a_rows_sum_does_not_depend_on_the_other_rows():
    """Rows 0..3 of a 13-token MoE batch == the same rows gathered alone (their positions in
    the same relative order): the sum of a row sees its own positions only."""
    rows, top_k = 13, 4
    idx = _moe_index(rows, top_k, 8, seed=6)
    grad = _grad(idx.shape[0], 96, torch.bfloat16, seed=7)
    full = gather_rows_backward_reference(grad.to(DEV), idx.to(DEV), rows)
    mine = (idx < 4).nonzero().squeeze(1)
    alone = gather_rows_backward_reference(grad[mine].to(DEV), idx[mine].to(DEV), 4)
    assert_bitwise_equal(full[:4], alone, "rows alone vs in the batch")
    from fp4_compile.codegen.invariant.gather_rows_kernel import gather_rows_backward_triton

    kernel_alone = gather_rows_backward_triton(grad[mine].to(DEV), idx[mine].to(DEV), 4)
    assert_bitwise_equal(kernel_alone, full[:4], "kernel, rows alone")


def test_gather_rows_refuses_bad_operands():
    x = torch.randn(5, 4)
    with pytest.raises(ValueError, match="gather_rows needs idx"):
        gather_rows(x, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="gather_rows needs idx"):
        gather_rows(x, torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="floating tensor of >= 2 dims"):
        gather_rows(torch.randn(5), torch.tensor([0, 1]))


def test_gather_rows_survives_export():
    class Gather(torch.nn.Module):
        def forward(self, x, idx):
            return gather_rows(x, idx) * 2

    x, idx = torch.randn(6, 8), torch.tensor([5, 0, 0, 3])
    ep = torch.export.export(Gather(), (x, idx))
    assert any("gather_rows" in str(n.target) for n in ep.graph.nodes)
    assert_bitwise_equal(ep.module()(x, idx), x[idx] * 2, "exported")


@pytest.mark.parametrize("num_rows", [7, 2**15, 2**15 + 1])
def test_row_segments_on_narrow_keys_equal_the_int64_sort(num_rows):
    """row_segments sorts the row ids as int16 / int32 (fewer radix passes on CUDA): the same
    order, starts and counts as the int64 sort, at the int16 boundary too, negatives wrapped."""
    from fp4_compile.codegen.invariant.reference import row_segments

    g = torch.Generator().manual_seed(num_rows)
    idx = torch.randint(-num_rows, num_rows, (3 * num_rows,), generator=g).to(DEV)
    idx[:2] = torch.tensor([num_rows - 1, -num_rows])  # the extremes
    order, starts, counts = row_segments(idx, num_rows)
    wide = torch.where(idx < 0, idx + num_rows, idx).to(torch.int64)
    sorted_wide, want_order = torch.sort(wide, stable=True)
    rows = torch.arange(num_rows, device=DEV)
    want_starts = torch.searchsorted(sorted_wide, rows)
    want_counts = torch.searchsorted(sorted_wide, rows, right=True) - want_starts
    for got, want in ((order, want_order), (starts, want_starts), (counts, want_counts)):
        assert got.dtype == torch.int64 and torch.equal(got, want)
