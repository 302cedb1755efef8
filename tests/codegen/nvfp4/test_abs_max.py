"""The one-read max |x| kernels == torch's `x.abs().amax(...)` in FP32, bitwise, on ordinary
rows and on edge rows (all zeros, an inf, a NaN, FP32-huge, subnormal), per row, per tensor and
per expert segment."""

import os

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _rows(r, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, k, generator=g) * torch.logspace(-6, 3, r)[:, None]
    x[0] = 0.0
    x[1, k // 2] = float("-inf")
    x[3] = 1e-30 if dtype == torch.float32 else 1e-7
    x[4, -1] = -3.0e38 if dtype == torch.float32 else -60000.0
    return x.to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [1, 16, 200, 2100])
def test_row_and_tensor_abs_max_equal_torch(dtype, k):
    from fp4_compile.codegen.nvfp4.abs_max_kernel import row_abs_max, tensor_abs_max

    x = _rows(37, k, dtype, seed=k)
    assert_bitwise_equal(row_abs_max(x), x.abs().amax(dim=1).float(), "row amax")
    assert_bitwise_equal(tensor_abs_max(x), x.abs().amax().float(), "tensor amax")
    assert_bitwise_equal(tensor_abs_max(x[5:9].reshape(-1)), x[5:9].abs().amax().float(), "1-D")
    x[2, 0] = float("nan")
    rows = row_abs_max(x)
    assert torch.isnan(rows[2]) and not torch.isnan(rows[torch.arange(37, device=DEV) != 2]).any()
    assert torch.isnan(tensor_abs_max(x))
    assert tensor_abs_max(x[:0]).item() == 0.0


def test_segment_abs_max_equals_torch():
    from fp4_compile.codegen.nvfp4.abs_max_kernel import segment_abs_max

    x = _rows(30, 64, torch.bfloat16, seed=1)
    expert = torch.tensor([0] * 7 + [2] * 13 + [3] * 10, device=DEV)
    ends = torch.tensor([7, 7, 20, 30, 30], device=DEV)
    got = segment_abs_max(x, ends)
    want = torch.stack(
        [
            x[expert == e].abs().amax().float()
            if (expert == e).any()
            else torch.zeros((), device=DEV)
            for e in range(5)
        ]
    )
    assert_bitwise_equal(got, want, "segment amax")


def test_row_abs_max_refuses_strided_rows():
    from fp4_compile.codegen.nvfp4.abs_max_kernel import row_abs_max

    with pytest.raises(ValueError, match="unit stride"):
        row_abs_max(torch.zeros(4, 32, device=DEV).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [5, 48, 300])
def test_segment_column_abs_max_equals_the_scatter(dtype, d):
    """Bitwise: per (expert segment, column) max |x| == the scatter_reduce of |x| in FP32 it
    replaced; uneven segments longer than a row chunk, empty experts (0), inf rows; a NaN
    poisons exactly its own (expert, column)."""
    from fp4_compile.codegen.nvfp4.abs_max_kernel import segment_column_abs_max

    x = _rows(70, d, dtype, seed=d)
    counts = torch.tensor([0, 33, 1, 0, 36, 0])  # 70 rows; experts 0, 3, 5 empty
    ends = torch.cumsum(counts, 0).to(DEV)
    expert = torch.repeat_interleave(torch.arange(6), counts).to(DEV)
    a = x.abs().to(torch.float32)
    want = a.new_zeros((6, d)).scatter_reduce_(0, expert[:, None].expand_as(a), a, "amax")
    got = segment_column_abs_max(x, ends)
    assert_bitwise_equal(got, want, "segment column amax")
    assert_bitwise_equal(segment_column_abs_max(x, ends.to(torch.int32)), want, "int32 ends")
    x[40, d - 1] = float("nan")  # expert 4's rows are 34..69
    got = segment_column_abs_max(x, ends)
    assert torch.isnan(got[4, d - 1])
    assert int(torch.isnan(got).sum()) == 1
    with pytest.raises(ValueError, match="ends"):
        segment_column_abs_max(x, ends.float())


def test_vector_abs_max_is_torch_amax_nan_included():
    from fp4_compile.codegen.nvfp4.abs_max_kernel import vector_abs_max

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(4)
    for n in (1, 255, 256, 1000):  # below, at and past one block of the interpreter's loop
        v = (torch.randn(n, generator=g) * 10).to(dev)
        got = vector_abs_max(v)
        assert got.shape == () and got.dtype == torch.float32
        assert torch.equal(got, v.abs().amax())
    v = torch.zeros(700, device=dev)
    v[650] = float("nan")
    assert bool(vector_abs_max(v).isnan())
    assert float(vector_abs_max(torch.full((3,), -0.0, device=dev))) == 0.0
    with pytest.raises(ValueError, match="non-empty FP32 vector"):
        vector_abs_max(torch.zeros(0, device=dev))
    with pytest.raises(ValueError, match="non-empty FP32 vector"):
        vector_abs_max(torch.zeros(4, 2, device=dev))
