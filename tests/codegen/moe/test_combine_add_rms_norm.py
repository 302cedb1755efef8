"""`fp4_compile::moe_combine_add_rms_norm` (the MoE combine folded into the residual add + RMSNorm
that reads it) == `moe_combine` then `invariant_add_rms_norm`, bitwise, y and h: the op (CPU: the
composition of the two ops' references) and the Triton kernel (the interpreter here, CUDA on the
GPU: tests/gpu/test_gpu_combine_norm_fusion.py) against the two ops; BF16, a norm weight or
none, the combine as either addend, a permutation and an index with repeated and negative rows,
signed zeros, row lengths that are and are not a power of two, several rows per program."""

import os

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
BF16 = torch.bfloat16


def _case(t=5, k=3, h=700, permutation=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = t * k
    x = (torch.randn(s, h, generator=g) * 3).to(BF16)
    x[0, :4] = torch.tensor([0.0, -0.0, 1e-30, -1e-30])
    w = torch.rand(s, 1, generator=g).to(BF16)
    if permutation:
        idx = torch.randperm(s, generator=g)
    else:  # repeated rows, a row never read, a negative (wrapping) index
        idx = torch.randint(0, s - 1, (s,), generator=g)
        idx[3] = -2
    residual = (torch.randn(t, 1, h, generator=g) * 2).to(BF16)
    residual[0, 0, :2] = torch.tensor([-0.0, 0.0])  # signed zeros meet the combine's zeros
    weight = (1.0 + 0.3 * torch.randn(h, generator=g)).to(BF16)
    return residual, x, w, idx, k, weight


def _two_ops(residual, x, w, idx, k, weight, eps, combine_first=False):
    c = ops.moe_combine(x, w, idx, k).view(residual.shape)
    a, b = (c, residual) if combine_first else (residual, c)
    return ops.invariant_add_rms_norm(a, b, weight, eps)


def _check(got, want, what):
    for name, a, b in zip(("y", "h"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name)
        assert_bitwise_equal(a, b, f"{what}: {name}")


@pytest.mark.parametrize("permutation", [True, False], ids=["perm", "repeats"])
@pytest.mark.parametrize("has_weight", [True, False], ids=["weight", "no-weight"])
@pytest.mark.parametrize("combine_first", [False, True], ids=["residual+c", "c+residual"])
def test_op_equals_the_two_ops(permutation, has_weight, combine_first):
    residual, x, w, idx, k, weight = _case(permutation=permutation)
    weight = weight if has_weight else None
    got = ops.moe_combine_add_rms_norm(residual, x, w, idx, k, weight, 1e-6)
    _check(got, _two_ops(residual, x, w, idx, k, weight, 1e-6, combine_first), "op vs two ops")


def test_op_refuses_a_residual_of_another_shape_or_dtype():
    residual, x, w, idx, k, weight = _case()
    with pytest.raises(ValueError, match="residual must be"):
        ops.moe_combine_add_rms_norm(residual[:2], x, w, idx, k, weight, 1e-6)
    with pytest.raises(ValueError, match="residual must be"):
        ops.moe_combine_add_rms_norm(residual.float(), x, w, idx, k, weight, 1e-6)


@pytest.mark.parametrize(
    ("t", "h"), [(5, 700), (7, 64), (40, 128)], ids=["h700", "h64-rows", "h128-rows"]
)
@pytest.mark.parametrize("permutation", [True, False], ids=["perm", "repeats"])
@pytest.mark.parametrize("has_weight", [True, False], ids=["weight", "no-weight"])
def test_kernel_equals_the_two_ops(t, h, permutation, has_weight):
    """The kernel (CUDA, or the interpreter) == the two ops on the same device, bitwise."""
    pytest.importorskip("triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen.moe.combine_add_rms_norm_kernel import (
        moe_combine_add_rms_norm_triton,
    )

    case = _case(t=t, h=h, permutation=permutation)
    residual, x, w, idx, k, weight = (a.to(dev) if torch.is_tensor(a) else a for a in case)
    weight = weight if has_weight else None
    got = moe_combine_add_rms_norm_triton(residual, x, w, idx, k, weight, 1e-6)
    _check(got, _two_ops(residual, x, w, idx, k, weight, 1e-6), "kernel vs two ops")


def test_opcheck():
    """Schema, fake and dispatch agree (no autograd: the op is for inference graphs)."""
    residual, x, w, idx, k, weight = _case(t=3, h=64)
    torch.library.opcheck(
        ops.moe_combine_add_rms_norm.default,
        (residual, x, w, idx, k, weight, 1e-6),
        test_utils=("test_schema", "test_faketensor"),
    )
