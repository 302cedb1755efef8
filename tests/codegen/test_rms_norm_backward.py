"""The one-launch RMSNorm backward kernel: against the same math in float64 within the FP32
rounding bound (the sums run in another order than the CPU path's), dh of a row bitwise the same
alone and in a batch, dweight bitwise the same on a rerun, and no weight."""

import os

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
U = 2.0**-24


def _inputs(r, hdim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(r, hdim, generator=g) * torch.logspace(-2, 2, r)[:, None]).to(dtype)
    gy = torch.randn(r, hdim, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(hdim, generator=g)).to(dtype)
    return gy.to(DEV), h.to(DEV), w.to(DEV)


def _exact(gy, h, w, eps):
    """The kernel's math in float64, with n rounded to h's dtype where dweight uses it; also
    the magnitudes that bound the FP32 error."""
    h64, g64, w64 = h.double(), gy.double(), w.double()
    hdim = h.shape[-1]
    rstd = 1 / torch.sqrt((h64 * h64).sum(-1, keepdim=True) / hdim + eps)
    n = h64 * rstd
    n_q = (h.float() * rstd.float()).to(h.dtype).double()
    dw = (g64 * n_q).sum(0)
    gw = g64 * w64
    dot = (gw * n).sum(-1, keepdim=True) / hdim
    dh = rstd * (gw - n * dot)
    mag = rstd * (gw.abs() + n.abs() * (gw * n).abs().sum(-1, keepdim=True) / hdim)
    return dh, dw, mag, (g64 * n_q).abs().sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hdim", [64, 200])
def test_rms_norm_backward_kernel_matches_exact_math(dtype, hdim):
    from fp4_compile.codegen.rms_norm_backward import rms_norm_backward

    r, eps = 70, 1e-6
    gy, h, w = _inputs(r, hdim, dtype)
    dh, dw = rms_norm_backward(gy, h, w, eps)
    assert dh.dtype == dtype and dw.dtype == dtype
    dh_x, dw_x, mag, dw_mag = _exact(gy.cpu(), h.cpu(), w.cpu(), eps)
    # FP32: the row sums and the FP32 steps, a few ulps of the magnitudes; a 16-bit output
    # adds its one rounding (<= 2**-8 relative)
    out_ulp = 0.0 if dtype == torch.float32 else 2.0**-8
    bound = 4 * hdim * U * mag + out_ulp * dh_x.abs()
    assert bool(((dh.cpu().double() - dh_x).abs() <= bound).all()), "dh"
    dw_bound = 4 * r * U * dw_mag + out_ulp * dw_x.abs()
    assert bool(((dw.cpu().double() - dw_x).abs() <= dw_bound).all()), "dweight"


def test_rms_norm_backward_kernel_rows_are_invariant_and_dweight_deterministic():
    from fp4_compile.codegen.rms_norm_backward import TILES_PER_PROGRAM, rms_norm_backward, tiling

    tile = tiling(96)[1]
    per_program = tile * TILES_PER_PROGRAM
    gy, h, w = _inputs(2 * per_program + 5, 96, torch.bfloat16, seed=3)
    dh, dw = rms_norm_backward(gy, h, w, 1e-6)
    # across tile and program boundaries
    for i in (0, tile - 1, tile, per_program - 1, per_program, 2 * per_program + 4):
        dh_i, _ = rms_norm_backward(gy[i : i + 1], h[i : i + 1], w, 1e-6)
        assert_bitwise_equal(dh_i[0], dh[i], f"row {i}")
    _, dw2 = rms_norm_backward(gy, h, w, 1e-6)
    assert_bitwise_equal(dw2, dw, "dweight rerun")
    dh_nw, dw_nw = rms_norm_backward(gy, h, None, 1e-6)
    assert dw_nw is None
    ones = torch.ones_like(w)
    assert_bitwise_equal(dh_nw, rms_norm_backward(gy, h, ones, 1e-6)[0], "no weight == ones")


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_rms_norm_backward_reads_strided_grads_bitwise(layout):
    """q_norm / k_norm gradients arrive as a transposed view [B, S, heads, D] of [B, heads, S,
    D] memory, or a row-sliced one: read through their strides, the same bits as contiguous."""
    from fp4_compile.codegen.rms_norm_backward import rms_norm_backward

    b, s, heads, d = 2, 5, 3, 64
    gy, h, w = _inputs(b * s * heads, d, torch.bfloat16, seed=4)
    h = h.reshape(b, s, heads, d)
    if layout == "transposed":
        g = gy.reshape(b, heads, s, d).transpose(1, 2)
    else:
        g = torch.cat([gy.reshape(b, s, heads, d)] * 2, dim=-1)[..., :d]
    assert not g.is_contiguous()
    dh, dw = rms_norm_backward(g, h, w, 1e-6)
    dh_c, dw_c = rms_norm_backward(g.contiguous(), h, w, 1e-6)
    assert_bitwise_equal(dh, dh_c, "dh")
    assert_bitwise_equal(dw, dw_c, "dweight")
