"""Shared weight global scales (`NVFP4Recipe.shared_weight_scale`): `fp4_compile::weight_group_amax`
and `quantize(w, "16x16", "shared", amax)`.

Bitwise tier: the group amax equals `reference.group_amax` and the per-tensor amax of the members
stacked along N; quantizing each member with it gives, byte for byte, the rows of the per-tensor
quantize of the stacked weight (reference, and the Triton kernel in the interpreter / on CUDA);
the op passes opcheck; bad input is refused naming the argument.
"""

import os

import pytest
import torch

from fp4_compile import codegen  # noqa: F401  (registers the ops)
from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
SHAPES = ((128, 64), (32, 64), (32, 64))  # q, k, v of a GQA attention: N differs, K shared


def _members(dtype=torch.bfloat16, seed=0, scales=(1.0, 3.0, 0.5)):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(*shape, generator=g) * s * torch.logspace(-2, 1, shape[-1])).to(dtype)
        for shape, s in zip(SHAPES, scales)
    ]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_group_amax_is_the_stacked_amax(dtype):
    ws = _members(dtype)
    amax = ops.weight_group_amax(ws)
    assert amax.shape == () and amax.dtype == torch.float32
    assert_bitwise_equal(amax, ref.group_amax(ws), "op vs reference")
    stacked = ref.global_amax(torch.cat(ws), "per_tensor")
    assert_bitwise_equal(amax, stacked, "group amax vs the stacked tensor's amax")


@pytest.mark.parametrize("scales", [(1.0, 3.0, 0.5), (0.0, 0.0, 0.0), (1.0, 0.0, 1e-30)])
def test_shared_quantize_is_the_stacked_per_tensor_quantize(scales):
    ws = _members(scales=scales)
    amax = ops.weight_group_amax(ws)
    whole = ref.quantize(torch.cat(ws), block="16x16", global_scale="per_tensor")
    row = 0
    for i, w in enumerate(ws):
        codes, block_scales, gd = ops.quantize(w, "16x16", "shared", amax, "rne", 0)
        rows = slice(row, row + w.shape[0])
        assert_bitwise_equal(codes, whole.codes[rows], f"member {i} codes")
        assert_bitwise_equal(block_scales, whole.block_scales[rows], f"member {i} block scales")
        assert_bitwise_equal(gd, whole.global_decode, f"member {i} global decode")
        row += w.shape[0]


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
@pytest.mark.parametrize("out", ["packed", "ongrid"])
def test_kernel_with_the_group_amax_equals_reference(out):
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ws = [w.to(dev) for w in _members()]
    amax = ops.weight_group_amax(ws)
    for i, w in enumerate(ws):
        want = ref.quantize(w, block="16x16", global_scale=amax)
        got = quantize_triton(w, block="16x16", global_scale=amax, out=out)
        if out == "packed":
            assert_bitwise_equal(got.codes, want.codes, f"member {i} codes")
            assert_bitwise_equal(got.block_scales, want.block_scales, f"member {i} scales")
            assert_bitwise_equal(got.global_decode, want.global_decode, f"member {i} gd")
        else:
            values, gd = got
            assert_bitwise_equal(values, want.on_grid(torch.bfloat16), f"member {i} on-grid")
            assert_bitwise_equal(gd, want.global_decode, f"member {i} gd")


def test_opcheck():
    ws = _members()
    torch.library.opcheck(ops.weight_group_amax.default, (ws,))
    amax = ops.weight_group_amax(ws)
    torch.library.opcheck(ops.quantize.default, (ws[0], "16x16", "shared", amax, "rne", 0))


def test_bad_input_names_the_argument():
    ws = _members()
    with pytest.raises(ValueError, match="weights must hold at least one"):
        ops.weight_group_amax([])
    with pytest.raises(TypeError, match=r"weights\[1\] must be float32"):
        ops.weight_group_amax([ws[0], ws[1].to(torch.int32)])
    with pytest.raises(ValueError, match="'shared' needs static_amax"):
        ops.quantize(ws[0], "16x16", "shared", None, "rne", 0)
    with pytest.raises(ValueError, match="one group amax"):
        ops.quantize(ws[0], "16x16", "shared", torch.ones(2), "rne", 0)


def test_quantize_weight_api_with_a_group():
    """codegen.quantize_weight(w, recipe, group=...) is the lowering's shared quantize; with the
    recipe's shared_weight_scale off it is the per-tensor quantize; a group without the weight
    is refused."""
    from fp4_compile import NVFP4Recipe
    from fp4_compile.codegen import quantize_weight

    ws = _members()
    amax = ops.weight_group_amax(ws)
    got = quantize_weight(ws[1], NVFP4Recipe.strict(), group=ws)
    codes, scales, gd = ops.quantize(ws[1], "16x16", "shared", amax, "rne", 0)
    assert_bitwise_equal(got.codes, codes, "codes")
    assert_bitwise_equal(got.global_decode, gd, "global decode")
    off = quantize_weight(ws[1], NVFP4Recipe.strict(shared_weight_scale=False), group=ws)
    assert_bitwise_equal(off.global_decode, ref.quantize(ws[1], block="16x16").global_decode, "off")
    with pytest.raises(ValueError, match="group must hold"):
        quantize_weight(ws[1], NVFP4Recipe.strict(), group=[ws[0], ws[2]])


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_group_abs_max_kernel_equals_reference(dtype):
    """The CUDA implementation of weight_group_amax (`abs_max_kernel.group_abs_max`, run here in
    the interpreter off a GPU) == reference.group_amax bitwise, a NaN in any member making it NaN
    as torch's amax does."""
    from fp4_compile.codegen.nvfp4.abs_max_kernel import group_abs_max

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ws = [w.to(dev) for w in _members(dtype)]
    assert_bitwise_equal(group_abs_max(ws), ref.group_amax(ws), "group abs max")
    ws[2][3, 5] = float("nan")
    assert torch.isnan(group_abs_max(ws)) and torch.isnan(ref.group_amax(ws))
