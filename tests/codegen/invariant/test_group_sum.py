"""The one-pass group sum (CUDA's `ordered_sum` and attention's GQA dK / dV group sum; the
interpreter here) == the torch ops it replaces, bitwise: BF16 partial sums rounded at every step (ties, carries
into the exponent, overflow to inf, NaN where torch has NaN), FP32 sums rounded once, signed
zeros."""

import os

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _equal_nan_anywhere(got, want, what):
    """Bitwise equal, NaN where the reference has NaN (a NaN's payload follows no rule: ATen's
    own BF16 conversions give 0x7FC0, 0xFFFF or 0x7FFF depending on the path)."""
    got = got.cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{what}: NaN positions"
    assert_bitwise_equal(
        got.where(~torch.isnan(got), 0.0), want.where(~torch.isnan(want), 0.0), what
    )


def _x(a, n, c, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(a, n, c, generator=g) * torch.logspace(-3, 3, c)
    x[0, :, 0] = -0.0  # all negative zeros: -0.0
    x[0, :, 1] = torch.tensor([1.0, 2.0**-8, 2.0**-8] + [0.0] * (n - 3))  # BF16 ties
    x[0, :, 2] = 3.0e38  # overflow to inf along the way
    x[0, 1, 3] = float("nan")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 8, 1000), (2, 4, 2500)])
def test_round_each_equals_ordered_sum_torch(dtype, shape):
    from fp4_compile.codegen.invariant.group_sum_kernel import group_sum
    from fp4_compile.codegen.invariant.ordered_sum import ordered_sum_torch

    x = _x(*shape, dtype, seed=shape[2])
    want = ordered_sum_torch(x, 1, False)
    got = group_sum(x.to(DEV), round_each=True, out_dtype=dtype)
    _equal_nan_anywhere(got, want, "ordered sum, rounded each step")
    assert torch.signbit(got[0, 0]) and torch.isinf(got[0, 2]) and torch.isnan(got[0, 3])


@pytest.mark.parametrize(
    "dtype,out",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.bfloat16),
        (torch.float32, torch.float32),
    ],
)
def test_round_end_equals_kv_group_sum_torch(dtype, out):
    from fp4_compile.codegen.invariant.group_sum_kernel import group_sum
    from fp4_compile.codegen.invariant.reference import kv_group_sum

    b, h, n_rep, t, d = 2, 3, 4, 5, 64
    grad = _x(b * h, n_rep, t * d, dtype, seed=7).reshape(b, h * n_rep, t, d)
    want = kv_group_sum(grad, n_rep, out)
    got = group_sum(grad.reshape(b * h, n_rep, t * d).to(DEV), round_each=False, out_dtype=out)
    _equal_nan_anywhere(got.reshape(want.shape), want, "group sum, rounded once")


def test_bad_input_is_named():
    from fp4_compile.codegen.invariant.group_sum_kernel import group_sum

    x = torch.zeros(2, 3, 4, device=DEV)
    with pytest.raises(ValueError, match="dtypes"):
        group_sum(x.half(), round_each=False, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="round_each"):
        group_sum(x, round_each=True, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"\[A, N >= 1, C\]"):
        group_sum(x[0], round_each=False, out_dtype=torch.float32)
