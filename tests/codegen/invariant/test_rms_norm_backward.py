"""The RMSNorm backward kernel: against the same math in float64 within the FP32 rounding bound
(the sums run in another order than the CPU path's), dh of a row bitwise the same alone and in a
batch, dweight bitwise the same on a rerun, and no weight. dweight's partial sum over programs
(`partial_sum_kernel`): bitwise its written-out order of FP32 adds, within the FP32 error bound
of a float64 sum, deterministic."""

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
    from fp4_compile.codegen.invariant.rms_norm_backward_kernel import rms_norm_backward

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
    from fp4_compile.codegen.invariant.rms_norm_backward_kernel import (
        rms_norm_backward,
        tiles_per_program,
        tiling,
    )

    tile = tiling(96)[1]
    per_program = tile * tiles_per_program()
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
    from fp4_compile.codegen.invariant.rms_norm_backward_kernel import rms_norm_backward

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


def _partials(num_programs, hdim, seed):
    """FP32 partials of mixed signs over six decades (the sums cancel), with a column of -0.0,
    one of +0.0 and -0.0 mixed, and one of a single nonzero term."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_programs, hdim, generator=g) * torch.logspace(-3, 3, num_programs)[:, None]
    x[:, 0] = -0.0
    x[:, 1] = torch.where(torch.arange(num_programs) % 3 == 0, 0.0, -0.0)
    x[:, 2] = 0.0
    x[num_programs // 2, 2] = -1.5
    return x


def _sequential_sum(x):
    """((x[0] + x[1]) + x[2]) + ...: one FP32 add per program, in program order."""
    acc = x[0].clone()
    for row in x[1:]:
        acc = acc + row
    return acc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_partial_sum_is_the_ordered_fp32_sum_bitwise(dtype):
    """Bitwise: dweight's partial sum (`partial_sum_kernel`) with one chain is the sequential FP32
    sum over programs cast once to the output dtype; with the pinned CHAINS it is
    `partial_sum_reference`'s chains-then-tree order, and that reference with one chain is the
    sequential sum. Program counts below, at, and past CHAINS, with a partial last tile; signed
    zeros kept."""
    from fp4_compile.codegen.invariant.partial_sum_kernel import (
        CHAINS,
        partial_sum,
        partial_sum_reference,
    )

    for num_programs in (1, 3, 17, CHAINS, 2 * CHAINS + 1, 3 * CHAINS + 8):
        x = _partials(num_programs, 70, seed=num_programs)
        sequential = _sequential_sum(x).to(dtype)
        got = partial_sum(x.to(DEV), dtype, chains=1).cpu()
        assert_bitwise_equal(got, sequential, f"P={num_programs} one chain vs sequential")
        assert_bitwise_equal(
            partial_sum_reference(x, dtype, chains=1), sequential, "reference with one chain"
        )
        for chains in (4, CHAINS):
            got = partial_sum(x.to(DEV), dtype, chains=chains).cpu()
            want = partial_sum_reference(x, dtype, chains=chains)
            assert_bitwise_equal(got, want, f"P={num_programs} chains={chains} vs reference")


def test_partial_sum_within_fp32_error_of_float64_and_deterministic(monkeypatch):
    """Error budget (float64 oracle): any order of FP32 adds over P terms errs by at most
    (P - 1) * eps32 * sum|terms| (eps32 = 2**-23 covers gamma_{P-1}), plus the final cast's half
    ulp of the stored value. Bitwise the same on a rerun, from a fresh copy, for a column
    alone, and with another column tiling (a speed setting, not part of the order)."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.invariant import partial_sum_kernel
    from fp4_compile.codegen.invariant.partial_sum_kernel import partial_sum
    from fp4_compile.codegen.runtime import arch_of

    num_programs, hdim = 300, 200
    x = _partials(num_programs, hdim, seed=7)
    exact, magnitude = x.double().sum(0), x.double().abs().sum(0)
    for dtype in (torch.float32, torch.bfloat16):
        got = partial_sum(x.to(DEV), dtype).cpu()
        half_ulp = (
            torch.nextafter(got.abs(), torch.tensor(float("inf"), dtype=dtype)).double()
            - got.abs().double()
        ) / 2
        bound = (num_programs - 1) * 2.0**-23 * magnitude + half_ulp
        err = (got.double() - exact).abs()
        assert bool((err <= bound).all()), f"{int((err > bound).sum())} columns past the bound"
        assert_bitwise_equal(partial_sum(x.clone().to(DEV), dtype).cpu(), got, "rerun")
        narrow = partial_sum(x[:, :37].contiguous().to(DEV), dtype).cpu()
        assert_bitwise_equal(narrow, got[:37], "columns alone")
        with monkeypatch.context() as m:
            key = (arch_of(torch.device(DEV)), "partial_sum")
            tile = {**configs.pick_launch(*key), "tile_elements": 4 * partial_sum_kernel.CHAINS}
            m.setitem(configs.LAUNCH, key, tile)
            assert_bitwise_equal(partial_sum(x.to(DEV), dtype).cpu(), got, "other tiling")


def test_rms_norm_backward_op_of_a_transposed_input_matches_its_fake():
    """Gemma3 normalizes q/k after a transpose: the op's outputs are contiguous whatever h's
    layout, as its fake promises (Inductor checks the strides), with the values of the
    contiguous input, bitwise; opcheck passes on the strided input."""
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 12, 4, 32, generator=g).to(DEV).transpose(1, 2)  # [2, 4, 12, 32] strided
    gy = torch.randn(2, 4, 12, 32, generator=g).to(DEV)
    w = (1 + 0.1 * torch.randn(32, generator=g)).to(DEV)
    op = torch.ops.fp4_compile.invariant_rms_norm_backward.default
    dh, dw = op(gy, h, w, 1e-6)
    assert dh.is_contiguous() and dw.is_contiguous()
    dh_ref, dw_ref = op(gy, h.contiguous(), w, 1e-6)
    assert_bitwise_equal(dh, dh_ref, "dh, strided vs contiguous h")
    assert_bitwise_equal(dw, dw_ref, "dweight, strided vs contiguous h")
    torch.library.opcheck(op, (gy, h, w, 1e-6))
