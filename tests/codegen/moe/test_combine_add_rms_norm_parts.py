"""`fp4_compile::moe_combine_add_rms_norm_parts` (the MoE combine folded into the strict recipe's
next input norm, which leaves its codes to the decode GEMM) == `moe_combine` then
`rms_norm_quantize_parts`, bitwise, y, the row maxima and h: the op (CPU: the composition of
the two ops) and the kernel's parts form (the interpreter here, CUDA on the GPU:
tests/gpu/test_gpu_combine_norm_parts.py) against the two ops' references; BF16, a norm weight
or none, the combine as either addend, a permutation and an index with repeated and negative
rows, signed zeros, a NaN row, row lengths that are and are not a power of two, several rows per
program."""

import os

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile import NVFP4Recipe
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
BF16 = torch.bfloat16
KEY = NVFP4Recipe.strict().numerics_key
OUTPUTS = ("y", "on-grid", "global decode", "row maxima", "h")


def _case(t=5, k=3, h=704, permutation=True, seed=0, nan=False):
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
    if nan:
        residual[t - 1, 0, 5] = float("nan")
    weight = (1.0 + 0.3 * torch.randn(h, generator=g)).to(BF16)
    return residual, x, w, idx, k, weight


def _two_ops(residual, x, w, idx, k, weight, eps, combine_first=False):
    c = ops.moe_combine(x, w, idx, k).view(residual.shape)
    a, b = (c, residual) if combine_first else (residual, c)
    return ops.rms_norm_quantize_parts(a, b, weight, eps, KEY)


@pytest.mark.parametrize("permutation", [True, False], ids=["perm", "repeats"])
@pytest.mark.parametrize("has_weight", [True, False], ids=["weight", "no-weight"])
@pytest.mark.parametrize("combine_first", [False, True], ids=["residual+c", "c+residual"])
def test_op_equals_the_two_ops(permutation, has_weight, combine_first):
    residual, x, w, idx, k, weight = _case(permutation=permutation, nan=True)
    weight = weight if has_weight else None
    got = ops.moe_combine_add_rms_norm_parts(residual, x, w, idx, k, weight, 1e-6, KEY)
    want = _two_ops(residual, x, w, idx, k, weight, 1e-6, combine_first)
    for name, a, b in zip(OUTPUTS, got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert_bitwise_equal(a, b, f"op vs two ops: {name}")


def test_op_refuses_a_residual_of_another_shape_or_a_recipe_that_does_not_quantize():
    residual, x, w, idx, k, weight = _case(h=64)
    with pytest.raises(ValueError, match="residual must be"):
        ops.moe_combine_add_rms_norm_parts(residual[:2], x, w, idx, k, weight, 1e-6, KEY)
    with pytest.raises(ValueError, match="quantiz"):
        bf16_key = NVFP4Recipe.bf16().numerics_key
        ops.moe_combine_add_rms_norm_parts(residual, x, w, idx, k, weight, 1e-6, bf16_key)


@pytest.mark.parametrize(
    ("t", "h"), [(5, 704), (7, 64), (40, 128)], ids=["h704", "h64-rows", "h128-rows"]
)
@pytest.mark.parametrize("permutation", [True, False], ids=["perm", "repeats"])
@pytest.mark.parametrize("has_weight", [True, False], ids=["weight", "no-weight"])
def test_kernel_equals_the_two_ops(t, h, permutation, has_weight):
    """The parts form (CUDA, or the interpreter) == the two ops on the same device, bitwise: y, h
    and `rms_norm_amax`'s row maxima (the CPU op's maxima of y)."""
    pytest.importorskip("triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen.moe.combine_add_rms_norm_kernel import (
        moe_combine_add_rms_norm_amax,
    )

    case = _case(t=t, h=h, permutation=permutation, nan=True)
    residual, x, w, idx, k, weight = (a.to(dev) if torch.is_tensor(a) else a for a in case)
    weight = weight if has_weight else None
    y, parts, hsum = moe_combine_add_rms_norm_amax(residual, x, w, idx, k, weight, 1e-6)
    want = _two_ops(residual, x, w, idx, k, weight, 1e-6)
    assert torch.isnan(parts[-1]).all() and not torch.isnan(parts[:-1]).any()
    for name, a, b in (("y", y, want[0]), ("row maxima", parts, want[3]), ("h", hsum, want[4])):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert_bitwise_equal(a, b, f"kernel vs two ops: {name}")


def test_opcheck():
    """Schema, fake and dispatch agree (no autograd: the op is for inference graphs)."""
    residual, x, w, idx, k, weight = _case(t=3, h=64)
    torch.library.opcheck(
        ops.moe_combine_add_rms_norm_parts.default,
        (residual, x, w, idx, k, weight, 1e-6, KEY),
        test_utils=("test_schema", "test_faketensor"),
    )
