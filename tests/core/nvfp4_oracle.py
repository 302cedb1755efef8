"""An independent NVFP4 oracle, written differently from fp4_compile.reference on purpose.

Per element, in Python: FP32 operations through numpy float32 scalars (each one IEEE-rounded),
E4M3 and E2M1 rounding by exhaustive nearest search over exact `fractions.Fraction` values with
ties to the even code. Slow; for small tensors only.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

E2M1 = [
    Fraction(0),
    Fraction(1, 2),
    Fraction(1),
    Fraction(3, 2),
    Fraction(2),
    Fraction(3),
    Fraction(4),
    Fraction(6),
]


def e4m3_value(bits: int) -> Fraction | None:
    """Exact value of an E4M3 (fn) bit pattern; None for NaN (S.1111.111)."""
    sign = -1 if bits & 0x80 else 1
    exp = (bits >> 3) & 0xF
    man = bits & 0x7
    if exp == 0xF and man == 0x7:
        return None
    if exp == 0:
        return sign * Fraction(man, 8) * Fraction(1, 2**6)
    return sign * (1 + Fraction(man, 8)) * Fraction(2) ** (exp - 7)


POSITIVE_E4M3 = sorted({(e4m3_value(b), b) for b in range(0x7F)})  # 0 .. 448, with bit patterns


def round_e4m3(value: Fraction) -> tuple[Fraction, int]:
    """Round a non-negative value (already clamped to <= 448) to E4M3, ties to even mantissa."""
    best = None
    for v, bits in POSITIVE_E4M3:
        d = abs(v - value)
        key = (d, bits & 1)  # on a tie prefer the even bit pattern
        if best is None or key < best[0]:
            best = (key, v, bits)
    return best[1], best[2]


def round_e2m1(value: Fraction) -> int:
    """|value| <= 6 -> 3-bit magnitude index, ties to the even index."""
    mag = abs(value)
    best = None
    for i, v in enumerate(E2M1):
        key = (abs(v - mag), i & 1)
        if best is None or key < best[0]:
            best = (key, i)
    return best[1]


def f32(x) -> np.float32:
    return np.float32(x)


def quantize_row_blocks(
    values: list[float], amax: float
) -> tuple[list[int], list[int], np.float32]:
    """One row of 1x16 blocks given the (row or tensor) amax. Returns (codes, scale bits, decode)."""
    flt_max = np.finfo(np.float32).max
    with np.errstate(divide="ignore", over="ignore"):
        enc = f32(2688.0) / f32(amax)
    enc = min(enc, flt_max)
    if enc == 0:
        enc = f32(1.0)
    dec = f32(1.0) / enc
    mult = enc * (f32(1.0) / f32(6.0))
    codes, scale_bits = [], []
    for b in range(0, len(values), 16):
        blk = [f32(v) for v in values[b : b + 16]]
        vmax = max(abs(v) for v in blk)
        with np.errstate(over="ignore"):
            ds = min(vmax * mult, flt_max)
        ds = min(ds, f32(448.0))
        s, bits = round_e4m3(Fraction(float(ds)))
        scale_bits.append(bits)
        with np.errstate(divide="ignore", over="ignore"):
            es = min(f32(1.0) / (f32(float(s)) * dec), flt_max)
        for v in blk:
            with np.errstate(over="ignore"):
                scaled = v * es
            scaled = max(min(scaled, f32(6.0)), f32(-6.0))
            idx = round_e2m1(Fraction(float(scaled)))
            codes.append(idx | (8 if scaled < 0 else 0))
    return codes, scale_bits, dec
