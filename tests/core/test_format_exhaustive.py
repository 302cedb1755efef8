"""Exhaustive format tests (bitwise contract): every E2M1 code, every RNE tie, every E4M3 pattern,
packing order. Nothing here is approximate."""

from fractions import Fraction

import pytest
import torch
from nvfp4_oracle import POSITIVE_E4M3, e4m3_value, round_e4m3

from fp4_compile import dequantize, quantize
from fp4_compile.format import decode_e2m1, e2m1_values, pack_codes, unpack_codes
from fp4_compile.reference import e2m1_round_rne

MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_all_16_codes_decode():
    codes = torch.arange(16, dtype=torch.uint8)
    values = decode_e2m1(codes)
    assert values[:8].tolist() == MAGS
    assert values[8:].tolist() == [-m for m in MAGS]
    # code 8 is -0.0: sign bit set
    assert torch.signbit(values[8]).item() and not torch.signbit(values[0]).item()
    assert torch.equal(e2m1_values(), values)


@pytest.mark.parametrize(
    "value, code",
    [
        (0.25, 0),
        (0.2500001, 1),
        (0.75, 2),
        (0.7499999, 1),
        (1.25, 2),
        (1.2500001, 3),
        (1.75, 4),
        (1.7499999, 3),
        (2.5, 4),
        (2.5000002, 5),
        (3.5, 6),
        (3.4999998, 5),
        (5.0, 6),
        (5.0000005, 7),
        (6.0, 7),
        (0.0, 0),
        (-0.0, 0),
        (-0.1, 8),
        (-0.25, 8),
        (-0.75, 10),
        (-5.0, 14),
        (-6.0, 15),
    ],
)
def test_rne_table_every_tie(value, code):
    """Ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4."""
    v = torch.tensor([value], dtype=torch.float32)
    assert e2m1_round_rne(v).item() == code


def test_rne_matches_nearest_search_on_dense_grid():
    """Every float32 in a dense sweep of [-6, 6] rounds to the nearest code, ties to even."""
    v = torch.linspace(-6, 6, 24001, dtype=torch.float32)
    v = torch.cat(
        [
            v,
            torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]).repeat(2)
            * torch.tensor([1.0] * 7 + [-1.0] * 7),
        ]
    )
    codes = e2m1_round_rne(v)
    grid = torch.tensor(MAGS, dtype=torch.float64)
    dist = (v.abs().double()[:, None] - grid[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    candidates = (dist == best).double() * torch.arange(8, dtype=torch.float64)[None, :]
    # among tied candidates pick the even index
    ties = dist == best
    even = ties & (torch.arange(8)[None, :] % 2 == 0)
    expected = torch.where(
        even.any(1), (even * torch.arange(8)).sum(1), (ties * torch.arange(8)).sum(1)
    )
    del candidates
    assert torch.equal((codes & 7).long(), expected)
    assert torch.equal((codes >> 3).bool(), v < 0)


def test_all_256_e4m3_patterns_decode():
    raw = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    for bits in range(256):
        expected = e4m3_value(bits)
        if expected is None:
            assert torch.isnan(raw[bits]), bits
        else:
            assert Fraction(raw[bits].item()) == expected, bits


def test_e4m3_cast_is_round_to_nearest_even_at_every_midpoint():
    """The E4M3 cast used for block scales: every midpoint between neighbours goes to the even
    mantissa, and points just off a midpoint go to the nearer value (subnormals included)."""
    values = [v for v, _ in POSITIVE_E4M3]
    for lo, hi in zip(values, values[1:]):
        mid = (lo + hi) / 2
        for probe in (mid, mid - mid / 2**20, mid + mid / 2**20):
            expect_v, expect_bits = round_e4m3(probe)
            got = torch.tensor([float(probe)], dtype=torch.float32).to(torch.float8_e4m3fn)
            assert got.view(torch.uint8).item() == expect_bits, (float(probe), float(expect_v))


@pytest.mark.parametrize("bits", list(range(0x7F)))
def test_every_e4m3_scale_through_the_scale_path(bits):
    """With global amax 2688 (encode = decode = 1), a block whose max is 6*s gets scale s exactly
    and dequantizes exactly, for every finite non-negative E4M3 value s."""
    s = float(e4m3_value(bits))
    x = torch.zeros(2, 16)
    x[0, 0] = 2688.0  # pins the per-tensor amax
    x[1, :] = torch.tensor([6 * s, -6 * s, 3 * s, 0.5 * s] * 4)
    q = quantize(x, global_scale="per_tensor")
    assert q.global_decode.item() == 1.0
    assert q.block_scales[1, 0].view(torch.uint8).item() == bits
    assert torch.equal(dequantize(q)[1], x[1])


def test_packing_order_low_nibble_first():
    codes = torch.tensor([[1, 2, 3, 4, 15, 0, 8, 7]], dtype=torch.uint8)
    packed = pack_codes(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x0F, 0x78]]
    assert torch.equal(unpack_codes(packed), codes)


def test_quantized_bytes_follow_packing_order():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 6.0, -3.0  # codes 7 and 13 -> byte 0xD7
    q = quantize(x, global_scale="per_tensor")
    assert q.codes[0, 0].item() == 0xD7
