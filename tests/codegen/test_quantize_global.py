"""The one-launch per-row global stage == the torch ops of `global_stage(x, "per_row")`, bitwise,
on ordinary rows and on the edge rows (all zeros, an inf, a NaN, subnormal-tiny, FP32 huge)."""

import os

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [16, 144, 2048])
def test_row_global_stage_equals_torch(dtype, k):
    from fp4_compile.codegen.quantize_global import row_global_stage
    from fp4_compile.codegen.quantize_kernel import global_stage

    g = torch.Generator().manual_seed(k)
    x = torch.randn(37, k, generator=g) * torch.logspace(-6, 3, 37)[:, None]
    x[0] = 0.0
    x[1, k // 2] = float("inf")
    x[2, 3] = float("nan")
    x[3] = 1e-30 if dtype == torch.float32 else 1e-7
    x[4, -1] = -3.0e38 if dtype == torch.float32 else -60000.0
    x = x.to(dtype).to(DEV)
    gd, mult = row_global_stage(x)
    gd_ref, mult_ref = global_stage(x, "per_row")
    ok = torch.arange(37, device=DEV) != 2  # the NaN row: NaN either way (payloads may differ)
    assert_bitwise_equal(gd[ok], gd_ref.reshape(-1)[ok], "global decode")
    assert_bitwise_equal(mult[ok], mult_ref.reshape(-1)[ok], "multiplier")
    assert torch.isnan(gd[2]) and torch.isnan(mult[2]) and torch.isnan(gd_ref[2]).all()


def test_row_global_stage_rejects_strided_rows():
    from fp4_compile.codegen.quantize_global import row_global_stage

    with pytest.raises(ValueError, match="x2"):
        row_global_stage(torch.zeros(4, 32, device=DEV).t())
