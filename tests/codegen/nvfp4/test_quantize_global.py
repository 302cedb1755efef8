"""The quantizer's global stage (steps 1-4 of `reference.quantize`) in Triton == the reference's
functions (`global_amax`, `global_scales`), bitwise: per row in one launch, per tensor in two,
from a given amax in one; on ordinary rows and on the edge rows (all zeros, an inf, a NaN,
subnormal-tiny, FP32 huge)."""

import os

import pytest
import torch

from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [16, 144, 2048])
def test_row_global_stage_equals_torch(dtype, k):
    from fp4_compile.codegen.nvfp4.global_scale_kernel import row_global_stage

    g = torch.Generator().manual_seed(k)
    x = torch.randn(37, k, generator=g) * torch.logspace(-6, 3, 37)[:, None]
    x[0] = 0.0
    x[1, k // 2] = float("inf")
    x[2, 3] = float("nan")
    x[3] = 1e-30 if dtype == torch.float32 else 1e-7
    x[4, -1] = -3.0e38 if dtype == torch.float32 else -60000.0
    x = x.to(dtype).to(DEV)
    gd, mult = row_global_stage(x)
    _, gd_ref, mult_ref = ref.global_scales(ref.global_amax(x, "per_row"))
    ok = torch.arange(37, device=DEV) != 2  # the NaN row: NaN either way (payloads may differ)
    assert_bitwise_equal(gd[ok], gd_ref.reshape(-1)[ok], "global decode")
    assert_bitwise_equal(mult[ok], mult_ref.reshape(-1)[ok], "multiplier")
    assert torch.isnan(gd[2]) and torch.isnan(mult[2]) and torch.isnan(gd_ref[2]).all()


def test_row_global_stage_rejects_strided_rows():
    from fp4_compile.codegen.nvfp4.global_scale_kernel import row_global_stage

    with pytest.raises(ValueError, match="x2"):
        row_global_stage(torch.zeros(4, 32, device=DEV).t())


@pytest.mark.parametrize("case", ["normal", "zeros", "inf", "tiny"])
def test_per_tensor_global_stage_equals_torch_ops(case):
    """The two-launch per-tensor stage (row maxima, then the per-row stage over them) == the
    reference on torch's `x.abs().amax()`, bitwise; a NaN anywhere gives NaN scales."""
    from fp4_compile.codegen.nvfp4.quantize_kernel import global_stage

    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 96, generator=g) * 3.0
    if case == "zeros":
        x.zero_()
    elif case == "inf":
        x[7, 3] = float("inf")
    elif case == "tiny":
        x = x * 1e-30
    x = x.to(DEV)
    gd, mult = global_stage(x, "per_tensor")
    _, gd_ref, mult_ref = ref.global_scales(ref.global_amax(x, "per_tensor"))
    assert gd.shape == () and mult.shape == ()
    assert_bitwise_equal(gd, gd_ref, "global decode")
    assert_bitwise_equal(mult, mult_ref, "multiplier")
    x[1, 1] = float("nan")
    gd, mult = global_stage(x, "per_tensor")
    assert torch.isnan(gd) and torch.isnan(mult)


def test_amax_global_stage_equals_reference():
    """Scales from given amaxes (static amax, per expert) in one launch == `global_scales`:
    zero, inf, NaN, subnormal, huge, negative and ordinary amaxes, any shape."""
    from fp4_compile.codegen.nvfp4.global_scale_kernel import amax_global_stage
    from fp4_compile.codegen.nvfp4.quantize_kernel import global_stage

    edge = [0.0, float("inf"), float("nan"), 1e-45, 1e-38, 3.4e38, -2.5, 1.0, 448.0, 6.0]
    amax = torch.cat([torch.tensor(edge), torch.rand(300, generator=torch.Generator()) * 50])
    amax = amax.to(DEV)
    for shaped in (amax, amax.reshape(310, 1, 1), amax[:1].reshape(())):
        gd, mult = amax_global_stage(shaped)
        _, gd_ref, mult_ref = ref.global_scales(shaped)
        assert gd.shape == shaped.shape and mult.shape == shaped.shape
        ok = ~torch.isnan(shaped)
        assert_bitwise_equal(gd[ok], gd_ref[ok], "global decode")
        assert_bitwise_equal(mult[ok], mult_ref[ok], "multiplier")
        assert bool(torch.isnan(gd[~ok]).all() and torch.isnan(mult[~ok]).all())
    static = amax[3:7].reshape(4, 1)  # no NaN here: NaN payloads may differ (checked above)
    gd, mult = global_stage(torch.zeros(3, 4, device=DEV), static)
    assert_bitwise_equal(gd, ref.global_scales(static)[1], "static amax")
    with pytest.raises(TypeError, match="amax must be float32"):
        amax_global_stage(amax.double())


def test_expert_global_stage_equals_the_torch_per_expert_stage():
    """One launch == `quantize_kernel.global_stage(w, "per_expert")` (row maxima, torch's max per
    expert, the scale launch), bitwise, with NaN, inf and all-zero experts; the per-row copies
    repeat each expert's values N times."""
    from fp4_compile.codegen.nvfp4.abs_max_kernel import row_abs_max
    from fp4_compile.codegen.nvfp4.global_scale_kernel import expert_global_stage
    from fp4_compile.codegen.nvfp4.quantize_kernel import global_stage

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(12)
    w = (torch.randn(5, 80, 32, generator=g) * torch.logspace(-3, 2, 32)).to(dev)
    w[1, 7, 3], w[2, 79, 0], w[3] = float("nan"), float("inf"), 0.0
    gd, mult, gd_rows, mult_rows = expert_global_stage(row_abs_max(w.reshape(-1, 32)), 5)
    want_gd, want_mult = global_stage(w, "per_expert")
    assert_bitwise_equal(gd, want_gd.reshape(-1), "global decode")
    assert_bitwise_equal(mult, want_mult.reshape(-1), "multiplier")
    assert_bitwise_equal(gd_rows, want_gd.expand(5, 80, 1).reshape(-1), "per-row decode")
    assert_bitwise_equal(mult_rows, want_mult.expand(5, 80, 1).reshape(-1), "per-row mult")
    with pytest.raises(ValueError, match="row_amax"):
        expert_global_stage(torch.zeros(7, device=dev), 2)


def test_per_row_quantize_of_a_3d_input_equals_its_rows():
    """quantize_triton with per-row scales on a 3-D x == on its rows flattened to 2-D, bitwise
    (a 3-D x's per-row global decode [A, B, 1] once took the static per-expert branch)."""
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    x = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(2)).to(DEV)
    v3, gd3 = quantize_triton(x, block="1x16", global_scale="per_row", out="ongrid")
    v2, gd2 = quantize_triton(x.reshape(21, 32), block="1x16", global_scale="per_row", out="ongrid")
    assert v3.shape == (3, 7, 32) and gd3.shape == (3, 7, 1)
    assert_bitwise_equal(v3.reshape(21, 32), v2, "on-grid values")
    assert_bitwise_equal(gd3.reshape(21, 1), gd2, "global decode")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "k"), [(1, 4096), (1, 144), (5, 528)])
def test_few_rows_split_form_equals_reference_and_many_rows(dtype, rows, k):
    """Bitwise: a per-row on-grid quantize of fewer rows than row_quantize's split_rows_below
    (chunk maxima over column chunks, then `row_codes_kernel`: a wide row at batch 1 is many
    programs) == the reference, and == the same rows quantized inside a batch of many rows (the
    one-read global stage and the codes kernel); edge rows (zeros, inf, NaN) included."""
    from fp4_compile.codegen.configs import pick_launch
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.codegen.runtime import arch_of

    g = torch.Generator().manual_seed(rows * k)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-3, 3, rows)[:, None]
    if rows > 3:
        x[1] = 0.0
        x[2, k // 3] = float("inf")
        x[3, 5] = float("nan")
    x = x.to(dtype).to(DEV)
    many = pick_launch(arch_of(x.device), "row_quantize")["split_rows_below"]
    assert rows < many
    ongrid, gd = quantize_triton(x, block="1x16", global_scale="per_row", out="ongrid")
    filler = torch.randn(many, k, generator=g).to(dtype).to(DEV)
    batch_ongrid, batch_gd = quantize_triton(
        torch.cat([x, filler]), block="1x16", global_scale="per_row", out="ongrid"
    )
    assert_bitwise_equal(ongrid, batch_ongrid[:rows], "on-grid (alone vs in a batch)")
    assert_bitwise_equal(gd, batch_gd[:rows], "global decode (alone vs in a batch)")
    finite = torch.isfinite(x.cpu().float()).all(dim=-1)  # the reference refuses inf and NaN
    q = ref.quantize(x.cpu().float()[finite], block="1x16", global_scale="per_row")
    assert_bitwise_equal(gd.cpu()[finite], q.global_decode, "global decode vs reference")
    assert_bitwise_equal(ongrid.cpu()[finite], q.on_grid(torch.bfloat16), "on-grid vs reference")
