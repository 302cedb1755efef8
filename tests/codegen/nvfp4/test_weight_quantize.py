"""The weights' one-read quantize (`codegen/nvfp4/weight_quantize_kernel.py`): bitwise the two-step kernel path
(the amax pass, then `_quantize_kernel`) and the reference, for every output form, dtype and
global-scale mode, with NaN / inf / all-zero experts, ragged tiles and more experts than
programs. On CPU the interpreter runs it as two launches of the same kernel (amaxes, then
quantizes); on CUDA as one persistent launch whose programs wait for each expert's amax."""

import os

import pytest
import torch

from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal, assert_nvfp4_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _weights(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g) * torch.logspace(-3, 1, shape[-1])
    return w.to(dtype).to(DEV)


def _specials(w):
    """One expert with a NaN, one with an inf, one all zeros (-0.0 included), one huge value."""
    w[1, 5, 7] = float("nan")
    w[2, 31, 0] = float("inf")
    w[3] = 0.0
    w[3, 0, :16] = -0.0
    w[4, 17, 40] = 3.0e4
    return w


def _same(got, want, label):
    if isinstance(want, tuple):  # ("ongrid": (values, gd)) or ("both": (NVFP4Tensor, values))
        for i, (a, b) in enumerate(zip(got, want)):
            _same(a, b, f"{label}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert got.shape == want.shape and got.dtype == want.dtype, label
        assert_bitwise_equal(got, want, label)
    else:
        assert_nvfp4_equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("out", ["packed", "ongrid", "both"])
def test_per_expert_equals_two_step_path(dtype, out):
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.codegen.nvfp4.weight_quantize_kernel import quantize_weight_tiles

    w = _specials(_weights(5, 48, 96, dtype=dtype))  # 48 rows, 96 columns: ragged tiles
    got = quantize_weight_tiles(w, "per_expert", out=out)
    want = quantize_triton(
        w, block="16x16", global_scale="per_expert", out=out, one_read_weights=False
    )
    _same(got, want, f"{dtype} {out}")


@pytest.mark.parametrize("shape", [(64, 160), (2, 32, 64)])
def test_per_tensor_equals_reference(shape):
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.codegen.nvfp4.weight_quantize_kernel import quantize_weight_tiles

    w = _weights(*shape, dtype=torch.bfloat16, seed=3)
    got = quantize_weight_tiles(w, "per_tensor")
    want = ref.quantize(w, block="16x16", global_scale="per_tensor")
    assert_nvfp4_equal(got, want)
    assert_nvfp4_equal(quantize_triton(w, block="16x16", global_scale="per_tensor"), want)
    values, gd = quantize_weight_tiles(w, "per_tensor", out="ongrid")
    assert gd.shape == () and values.shape == w.shape
    assert_bitwise_equal(values, want.on_grid(torch.bfloat16), "on-grid per tensor")


def test_per_expert_equals_reference_with_specials():
    """NaN poisons its own expert only, inf gives its expert the unit encode, the finite
    experts (all zeros, -0.0 and a huge value included) equal the reference's per-expert
    quantize (which refuses non-finite input; the two-step test covers those experts)."""
    from fp4_compile.codegen.nvfp4.weight_quantize_kernel import quantize_weight_tiles

    w = _specials(_weights(5, 32, 64, dtype=torch.float32, seed=5))
    got = quantize_weight_tiles(w, "per_expert")
    gd = got.global_decode
    assert gd.shape == (5, 1, 1) and bool(gd[1].isnan().all()) and float(gd[2]) == 1.0
    keep = [0, 3, 4]
    want = ref.quantize_experts(w[keep])
    assert_bitwise_equal(gd[keep], want.global_decode, "global decode")
    assert_bitwise_equal(got.codes[keep], want.codes, "codes")
    assert_bitwise_equal(got.block_scales[keep], want.block_scales, "block scales")


def test_more_experts_than_programs_and_one_row_tile():
    """Experts outnumber the programs (the announce-ahead path covers every expert), and an
    expert of 16 rows (fewer rows than one tile)."""
    from fp4_compile.codegen.nvfp4.weight_quantize_kernel import quantize_weight_tiles

    w = _weights(11, 16, 32, dtype=torch.bfloat16, seed=7)
    assert_nvfp4_equal(quantize_weight_tiles(w, "per_expert"), ref.quantize_experts(w))


@pytest.mark.parametrize("groups", [2, 3, 4, 7])
def test_expert_groups_change_no_bit(groups):
    """Bitwise: the programs split into expert groups (group g walks experts g, g + G, ...; more
    groups than the interpreter's default programs, and groups that do not divide E) == the
    two-step form, packed and on-grid."""
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.codegen.nvfp4.weight_quantize_kernel import quantize_weight_tiles

    w = _specials(_weights(5, 48, 96, dtype=torch.bfloat16, seed=3))
    got = quantize_weight_tiles(w, "per_expert", out="both", expert_groups=groups)
    want = quantize_triton(
        w, block="16x16", global_scale="per_expert", out="both", one_read_weights=False
    )
    _same(got, want, f"{groups} groups")


def test_bad_arguments_name_themselves():
    from fp4_compile.codegen.nvfp4.weight_quantize_kernel import quantize_weight_tiles

    w = _weights(2, 32, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="global_scale"):
        quantize_weight_tiles(w, "per_row")
    with pytest.raises(ValueError, match="out"):
        quantize_weight_tiles(w, "per_expert", out="codes")
    with pytest.raises(ValueError, match="contiguous"):
        quantize_weight_tiles(w.transpose(1, 2), "per_expert")
    with pytest.raises(ValueError, match=r"\[E, N, K\]"):
        quantize_weight_tiles(w[0], "per_expert")
    with pytest.raises(ValueError, match="multiples of 16"):
        quantize_weight_tiles(w[:, :24], "per_expert")
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        quantize_weight_tiles(w.to(torch.float64), "per_tensor")
    with pytest.raises(ValueError, match="expert_groups"):
        quantize_weight_tiles(w, "per_expert", expert_groups=0)
