"""The `lower_silu_muls` and `lower_gathers` passes on small graphs: what they lower and what
they leave (a silu with other users, silu(x) squared, a silu whose input is written in place
before the multiply; tuple and int32 indices), with the compiled result bitwise the eager one."""

import pytest
import torch
import torch.nn.functional as F

import fp4_compile
from fp4_compile.testing import assert_bitwise_equal


def _counts(module, *inputs) -> dict:
    reports = fp4_compile.explain(module, *inputs, print_report=False)
    counts: dict = {}
    for rep in reports:
        for k, v in rep.counts.items():
            counts[k] = counts.get(k, 0) + v
    return counts


def _check_compiled_equals_eager(module, *inputs):
    want = module(*(t.clone() for t in inputs))
    torch._dynamo.reset()
    got = torch.compile(module, backend="minite", fullgraph=True)(*(t.clone() for t in inputs))
    assert_bitwise_equal(got, want, type(module).__name__)


class SwiGLU(torch.nn.Module):
    def forward(self, x, y):
        return F.silu(x) * y


class Squared(torch.nn.Module):  # both operands are the one silu
    def forward(self, x, y):
        s = F.silu(x)
        return s * s + y


class TwoSilus(torch.nn.Module):  # silu(x) has another user; silu(y) may still be absorbed
    def forward(self, x, y):
        sx = F.silu(x)
        return sx * F.silu(y) + sx


class WrittenBetween(torch.nn.Module):  # a changes between the silu and the multiply
    def forward(self, x, y):
        a = x + 1
        s = F.silu(a)
        a.mul_(2)
        return s * y + a


@pytest.mark.parametrize(
    "module,lowered",
    [(SwiGLU(), 1), (Squared(), 0), (TwoSilus(), 1), (WrittenBetween(), 0)],
    ids=["swiglu", "squared", "two_silus", "written_between"],
)
def test_silu_muls(module, lowered):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 24, generator=g), torch.randn(4, 24, generator=g)
    assert _counts(module, x, y).get("silu_mul", 0) == lowered
    _check_compiled_equals_eager(module, x, y)


class Gather(torch.nn.Module):
    def forward(self, x, idx):
        return x[idx] * 2


class TupleIndex(torch.nn.Module):
    def forward(self, x, idx):
        return x[idx, 0] * 2


@pytest.mark.parametrize(
    "module,index_dtype,lowered",
    [(Gather(), torch.int64, 1), (Gather(), torch.int32, 1), (TupleIndex(), torch.int64, 0)],
    ids=["int64", "int32", "tuple_index"],
)
def test_gathers(module, index_dtype, lowered):
    x = torch.randn(6, 5, 3, generator=torch.Generator().manual_seed(1))
    idx = torch.tensor([5, 0, 0, -1, 2], dtype=index_dtype)
    assert _counts(module, x, idx).get("gather_rows", 0) == lowered
    _check_compiled_equals_eager(module, x, idx)


def test_ops_keep_the_fake_layout_for_permuted_inputs():
    """Outputs are contiguous, as the fake implementations say, whatever the inputs' layout."""
    from fp4_compile.codegen.invariant.gather_rows import gather_rows
    from fp4_compile.codegen.invariant.silu_mul import silu_mul

    a, b = torch.randn(8, 6).t(), torch.randn(8, 6).t()
    torch.library.opcheck(torch.ops.fp4_compile.silu_mul.default, (a, b))
    assert silu_mul(a, b).is_contiguous()
    x, idx = torch.randn(5, 3, 4).permute(0, 2, 1), torch.tensor([4, 1, 1])
    torch.library.opcheck(torch.ops.fp4_compile.gather_rows.default, (x, idx))
    assert gather_rows(x, idx).is_contiguous()
