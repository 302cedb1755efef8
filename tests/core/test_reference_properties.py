"""Hypothesis properties of the reference quantizer and GEMMs.

Contracts: bitwise (sign symmetry, on-grid round trip, power-of-two invariance, per-row
independence, nvfp4_mm == float64 GEMM of the same on-grid values rounded once); an error bound
(half a grid step times the block scale, plus the underflow allowance of subnormal scales)."""

import numpy as np
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fp4_compile import dequantize, nvfp4_mm, quantize
from fp4_compile.format import decode_e2m1, pack_codes
from fp4_compile.testing import assert_bitwise_equal, assert_nvfp4_equal

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)

finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, width=32)


@st.composite
def matrices(draw, max_rows=6, max_blocks=3):
    rows = draw(st.integers(1, max_rows))
    cols = 16 * draw(st.integers(1, max_blocks))
    arr = draw(arrays(np.float32, (rows, cols), elements=finite))
    scale = draw(st.sampled_from([1e-6, 1e-3, 1.0, 1e3]))
    return torch.from_numpy(arr) * scale


modes = st.sampled_from(["per_tensor", "per_row"])


@SETTINGS
@given(x=matrices(), mode=modes)
def test_sign_symmetry(x, mode):
    q, qn = quantize(x, global_scale=mode), quantize(-x, global_scale=mode)
    assert_bitwise_equal(q.block_scales, qn.block_scales, "block scales of x and -x")
    assert_bitwise_equal(q.global_decode, qn.global_decode, "global scales of x and -x")
    assert torch.equal(dequantize(qn), -dequantize(q))  # values; +0 == -0


@SETTINGS
@given(
    codes=arrays(np.uint8, (4, 32), elements=st.integers(0, 15)),
    scale_bits=arrays(np.uint8, (4, 2), elements=st.integers(0x08, 0x7E)),
)
def test_exact_round_trip_of_on_grid_values(codes, scale_bits):
    """Values E2M1 x E4M3 with a +-6 in every block and one block scale 448 (global decode 1)
    quantize back to exactly themselves."""
    codes = torch.from_numpy(codes)
    codes[:, 0] = 7
    codes[:, 16] = 15
    scales = torch.from_numpy(scale_bits).view(torch.float8_e4m3fn).float()
    scales[0, 0] = 448.0
    x = decode_e2m1(codes) * scales.repeat_interleave(16, dim=1)
    q = quantize(x, global_scale="per_tensor")
    assert q.global_decode.item() == 1.0
    assert torch.equal(dequantize(q), x)
    mask = (codes != 8) & ~(codes == 0)
    expected = torch.where(codes == 8, torch.zeros_like(codes), codes)  # -0 encodes as +0
    assert torch.equal(q.unpacked_codes()[mask], expected[mask])


def _half_step(mag: torch.Tensor) -> torch.Tensor:
    """Largest distance from a value to its E2M1 code, by the code's magnitude."""
    return torch.where(mag < 2, 0.25, torch.where(mag < 4, 0.5, 1.0)).to(torch.float64)


@SETTINGS
@given(x=matrices(), mode=modes)
def test_error_bound(x, mode):
    q = quantize(x, global_scale=mode)
    deq = dequantize(q).double()
    mag = decode_e2m1(q.unpacked_codes()).abs()
    s = q.block_scales.double().repeat_interleave(16, dim=1)
    gd = q.global_decode.double()
    half = _half_step(mag)
    # half = 0.5 when the code is exactly 2 and x lies above it; 1.0 at 4: take the larger side.
    half = torch.where((mag == 2) | (mag == 4), half * 2, half)
    underflow = torch.where(s < 2**-6, 6 * 2**-10, 0.0)  # subnormal/zero block scales
    bound = (half * s + underflow) * gd * (1 + 1e-6) + 1e-45
    err = (x.double() - deq).abs()
    assert bool((err <= bound).all()), float((err - bound).max())


@SETTINGS
@given(x=matrices(), mode=modes, k=st.integers(-20, 20))
def test_power_of_two_scaling_invariance(x, mode, k):
    if float(x.abs().max()) == 0.0:
        x = x + 1.0
    amax = x.abs().amax(dim=-1) if mode == "per_row" else x.abs().max()
    nonzero = x.abs()[x != 0]
    # The property needs exact power-of-two scaling: no fp32 overflow and no underflow into
    # subnormals anywhere (inputs, scaled inputs), which would drop mantissa bits.
    smallest = float(nonzero.min()) * min(1.0, 2.0**k) if nonzero.numel() else 0.0
    assume(
        not bool((amax == 0).any())
        and float(x.abs().max()) * 2.0**k < 1e30
        and smallest > 2.0**-100
    )
    q, q2 = quantize(x, global_scale=mode), quantize(x * 2.0**k, global_scale=mode)
    assert_bitwise_equal(q.codes, q2.codes, "codes")
    assert_bitwise_equal(q.block_scales, q2.block_scales, "block scales")
    assert torch.equal(q.global_decode * 2.0**k, q2.global_decode)


@SETTINGS
@given(x=matrices(max_rows=8))
def test_per_row_independent_of_other_rows(x):
    q = quantize(x, global_scale="per_row")
    for i in range(x.shape[0]):
        assert_nvfp4_equal(q[i : i + 1], quantize(x[i : i + 1], global_scale="per_row"), f"row {i}")


@SETTINGS
@given(a=matrices(max_rows=5, max_blocks=4), data=st.data())
def test_nvfp4_mm_equals_float64_gemm_rounded_once(a, data):
    n = data.draw(st.integers(1, 5))
    b = torch.from_numpy(data.draw(arrays(np.float32, (16 * n, a.shape[1]), elements=finite)))
    qa = quantize(a, global_scale="per_row")
    qb = quantize(b, block="16x16", global_scale="per_tensor")
    acc = (qa.on_grid(torch.float64) @ qb.on_grid(torch.float64).T).to(torch.float32)
    expected = (acc * qa.global_decode) * qb.global_decode
    assert_bitwise_equal(nvfp4_mm(qa, qb), expected, "nvfp4_mm vs float64 oracle")


def test_pack_codes_roundtrip_random():
    g = torch.Generator().manual_seed(0)
    c = torch.randint(0, 16, (3, 64), generator=g, dtype=torch.uint8)
    from fp4_compile.format import unpack_codes

    assert torch.equal(unpack_codes(pack_codes(c)), c)
