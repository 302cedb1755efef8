"""The ONE module of shared Triton helpers (`@triton.jit` functions and constants), inlined into
the kernels of every family: BF16 rounding of FP32 values, the NVFP4 element/scale steps of the
quantizer and the GEMM, the stochastic-rounding stream (`sr_stream`'s, in registers) and the
grouped GEMMs' expert row tiles. Imports triton: import it only from kernel modules (which load
lazily).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import interpreting

ONE_SIXTH_F32 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))  # fp32(1/6), exactly


def dot_dtype():
    """The `tl.dot` operand dtype of the BF16 kernels: bf16 on CUDA, fp32 in the interpreter
    (where a bf16 `tl.dot` returns garbage; on-grid and bf16 values are exact in fp32)."""
    return tl.float32 if interpreting() else tl.bfloat16


@triton.jit
def round_bf16(x):
    """FP32 -> the nearest bf16 value (ties to even), still FP32: integer ops only."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def round_bf16_keep_nan(v):
    """`round_bf16`, NaN left as it is (its rounding add could carry a NaN
    payload into the sign bit); the store's conversion then gives a BF16 NaN."""
    return tl.where(v != v, v, round_bf16(v))


@triton.jit
def e4m3_rne(d):
    """FP32 d in [0, 448] -> (E4M3 byte as int32, its exact FP32 value); RNE, subnormals too."""
    bits = d.to(tl.int32, bitcast=True)
    # normal range (d >= 2**-6): round the 23-bit mantissa to 3 bits, ties to even
    r = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # clear the low 20 bits
    code_n = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)
    val_n = r.to(tl.float32, bitcast=True)
    # subnormal range (d < 2**-6): q = RNE(d * 2**9) on the integer mantissa
    e = (bits >> 23) - 127
    mant = (bits & 0x7FFFFF) | 0x800000
    shift = tl.minimum(14 - e, 25)
    q = mant >> shift
    rem = mant & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    val_s = q.to(tl.float32) * 0.001953125  # 2**-9, exact
    normal = d >= 0.015625
    return tl.where(normal, code_n, q), tl.where(normal, val_n, val_s)


@triton.jit
def e4m3_value(byte):
    """E4M3 byte (int32) -> exact FP32 value (non-negative scales; subnormals included)."""
    e = (byte >> 3) & 15
    m = byte & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    return tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)


@triton.jit
def e2m1_value(code):
    """E2M1 code (int32 0..15) -> FP32 value, exact (code 8 -> -0.0)."""
    idx = code & 7
    mag = tl.where(idx <= 4, idx.to(tl.float32) * 0.5, (idx - 2).to(tl.float32))
    mag = tl.where(idx == 7, 6.0, mag)
    sign = (code & 8) << 28  # bit 3 -> bit 31 (`-mag` would be 0 - mag: +0.0, not -0.0)
    return (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_scaled(mag):
    """|v| in [0, 6] -> (y, base): the E2M1 grid has spacing 0.5 on [0, 2), 1 on [2, 4) and 2
    on [4, 6], so y = |v| / spacing (exact: a power of two) lies in [0, 4] with the grid points
    at integers n, and the E2M1 index of n is base + n (base 0, 2, 4). Rounding y to an integer
    rounds |v| on the grid (ties to even: the even integer is the even E2M1 code), which is the
    threshold table of `reference.e2m1_round_rne`, in a handful of instructions."""
    small = mag < 2.0
    mid = mag < 4.0
    y = mag * tl.where(small, 2.0, tl.where(mid, 1.0, 0.5))
    return y, tl.where(small, 0, tl.where(mid, 2, 4))


@triton.jit
def e2m1_magnitude(idx):
    """E2M1 index 0..7 -> its magnitude as FP32 (0, 0.5, 1, 1.5, 2, 3, 4, 6), exact."""
    return tl.where(
        idx <= 4, idx.to(tl.float32) * 0.5, tl.where(idx == 7, 6.0, (idx - 2).to(tl.float32))
    )


@triton.jit
def tile16_max(vmax, BLOCK_M: tl.constexpr, NB: tl.constexpr):
    """Block maxima [BLOCK_M, NB] of 1x16 blocks -> those of their 16x16 tiles, broadcast back
    to every row of the tile."""
    tmax = tl.max(tl.reshape(vmax, (BLOCK_M // 16, 16, NB)), axis=1)
    return tl.reshape(tl.broadcast_to(tmax[:, None, :], (BLOCK_M // 16, 16, NB)), (BLOCK_M, NB))


@triton.jit
def block_encode(vmax, mult, gd):
    """Steps 6-7 of the blocks with maxima vmax: (E4M3 scale byte as int32, its FP32 value, the
    FP32 encode scale of the block's elements)."""
    d = vmax * mult  # ONE rounding (step 6)
    d = tl.minimum(tl.maximum(d, -448.0), 448.0)
    s_code, s_val = e4m3_rne(d)
    enc = tl.minimum(
        tl.math.div_rn(tl.full(s_val.shape, 1.0, tl.float32), s_val * gd),
        3.4028234663852886e38,
    )
    return s_code, s_val, enc


@triton.jit
def rne_integer(y):
    """y in [0, 4] -> (the nearest integer, ties to even, as int32 and as FP32): y + 2**23
    rounds y to an integer in ONE rounding (the FP32 ulp there is 1); its low mantissa bits
    are that integer (0..4)."""
    y_big = y + 8388608.0
    return y_big.to(tl.int32, bitcast=True) & 7, y_big - 8388608.0  # (the FP32 one exact)


@triton.jit
def rne_ongrid_magnitude(mag):
    """|v| in [0, 6] -> its RNE E2M1 magnitude, NaN -> 0: RNE to a multiple of the spacing in
    one rounding: adding 2**22 / 2**23 / 2**24 makes the FP32 ulp 0.5 / 1 / 2 (ties to the
    even multiple = the even code, as `rne_integer`); subtracting it back is exact."""
    big = tl.where(mag < 2.0, 4194304.0, tl.where(mag < 4.0, 8388608.0, 16777216.0))
    return tl.where(mag == mag, (mag + big) - big, 0.0)


@triton.jit
def signed_value(mag_n, v, s_val):
    """The on-grid value: magnitude mag_n with v's sign (code 8 is -0.0, as `e2m1_value`),
    times the block's E4M3 scale s_val [BM, NB] (exact)."""
    sign = (v < 0.0).to(tl.int32) << 31
    mag_q = (mag_n.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return mag_q * s_val[:, :, None]


@triton.jit
def store_packed(
    codes_ptr,
    scales_ptr,
    code,
    s_code,
    rows,
    rmask,
    pid_k,
    blk,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Store codes [BLOCK_M, NB, 16] as bytes (two per byte, low nibble first) and the scale
    bytes s_code [BLOCK_M, NB] of the rows `rows` (valid where rmask), column tile pid_k."""
    lo_c, hi_c = tl.split(tl.reshape(code, (BLOCK_M, BLOCK_K // 2, 2)))
    byte = (lo_c | (hi_c << 4)).to(tl.uint8)
    ccols = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    cmask = rmask[:, None] & (ccols[None, :] < K // 2)
    tl.store(codes_ptr + rows[:, None] * (K // 2) + ccols[None, :], byte, mask=cmask)
    smask = rmask[:, None] & (blk[None, :] < K // 16)
    tl.store(scales_ptr + rows[:, None] * (K // 16) + blk[None, :], s_code.to(tl.uint8), mask=smask)


@triton.jit
def scales_from_amax(amax, is_nan, one_sixth, BLOCK: tl.constexpr):
    """(global_decode, multiplier) of FP32 amaxes: the reference's steps 2-4 (`reference.
    global_scales`), one IEEE rounding per operation; NaN where `is_nan`."""
    enc = tl.minimum(
        tl.math.div_rn(tl.full((BLOCK,), 2688.0, tl.float32), amax), 3.4028234663852886e38
    )
    enc = tl.where(enc == 0.0, 1.0, enc)
    gd = tl.math.div_rn(tl.full((BLOCK,), 1.0, tl.float32), enc)
    mult = enc * one_sixth  # fp32(1/6): one rounding
    return tl.where(is_nan, float("nan"), gd), tl.where(is_nan, float("nan"), mult)


# ------------------------------------------------------------- stochastic rounding stream
@triton.jit
def mix32(h):
    """The "lowbias32" mixer on uint32 (products wrap mod 2^32), as `sr_stream.mix32`."""
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x846CA68B
    return h ^ (h >> 16)


@triton.jit
def sr_uniform(flat, key, key_hi):
    """`sr_stream.sr_uniforms` at int64 flat indices, in registers: bitwise the same stream
    (one mixer round; a second where the index's high word is not zero)."""
    lo = (flat & 0xFFFFFFFF).to(tl.uint32)
    hi = (flat >> 32).to(tl.uint32)
    h = mix32(lo ^ key)
    h = tl.where(hi != 0, mix32(h ^ hi ^ key_hi), h)
    return (h >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2**-24, exact


@triton.jit
def sr_uniform32(flat, key):
    """`sr_uniform` at flat indices below 2**31 held in int32 (their high word is 0): the
    same bits without 64-bit index arithmetic, one mixer round."""
    h = mix32(flat.to(tl.uint32) ^ key)
    return (h >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2**-24, exact


@triton.jit
def sr_key_of(s):
    """`sr_stream.sr_key` of int64 seeds s >= 0, as uint32: the key a stream is drawn with."""
    lo = (s & 0xFFFFFFFF).to(tl.uint32)
    hi = (s >> 32).to(tl.uint32)
    return mix32(mix32(lo) ^ hi ^ 0x9E3779B9)


# ----------------------------------------------------------------- grouped GEMM row tiles
@triton.jit
def expert_row_tile(t, group_end_ptr, M, E, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """Row tile t of a grouped GEMM: (its expert e, its BLOCK_M row indices, the expert's row
    end). The experts' M tiles are laid end to end, tile_end[e] = the tiles of experts 0..e,
    computed from the group ends (no per-call layout tensors); e == E: t is past the last
    expert's tiles (the grid's spare programs, which return)."""
    eidx = tl.arange(0, BLOCK_E)
    emask = eidx < E
    row_hi = tl.load(group_end_ptr + eidx, mask=emask, other=0)
    row_lo = tl.load(group_end_ptr + eidx - 1, mask=emask & (eidx > 0), other=0)
    tiles = tl.where(emask, (row_hi - row_lo + BLOCK_M - 1) // BLOCK_M, 0)
    tile_end = tl.where(emask, tl.cumsum(tiles, 0), 2147483647)
    e = tl.sum((tile_end <= t).to(tl.int32), axis=0)
    is_e = eidx == e
    tile_start = tl.sum(tl.where(is_e, tile_end - tiles, 0), axis=0)
    row_start = tl.sum(tl.where(is_e, row_lo, 0), axis=0)
    row_end = tl.minimum(tl.sum(tl.where(is_e, row_hi, 0), axis=0), M)
    rows = row_start + (t - tile_start) * BLOCK_M + tl.arange(0, BLOCK_M)
    return e, rows, row_end
