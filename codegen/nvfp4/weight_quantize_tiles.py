"""The per-program steps of the weights' one-read quantize (`weight_quantize_kernel.py`, whose
docstring gives the protocol): an expert's amax over this program's 16x16 tiles, announced with
an atomic max and a count (`announce_amax`), and the quantize of those tiles from the expert's
amax (`quantize_expert`), with the block-scale and rounding helpers of `codes_kernel`'s
`_quantize_kernel` (`triton_helpers.py`): the same bits.

Shape legend: E experts, N rows of an expert (out-features), K in-features; x is [E * N, K].
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_helpers import (
    block_encode,
    e2m1_scaled,
    rne_integer,
    rne_ongrid_magnitude,
    scales_from_amax,
    signed_value,
    store_packed,
    tile16_max,
)


@triton.jit
def _expert_abs_bits(
    bits_ptr, e, pid, P, N, K, ABS_MASK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr
):
    """max over this program's tiles of expert e of the bits of |x| (int32 scalar)."""
    tiles_k = tl.cdiv(K, BLOCK_K)
    m = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.int32)
    for t in range(pid, tl.cdiv(N, BLOCK_M) * tiles_k, P):
        tm = t // tiles_k
        rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (t - tm * tiles_k) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = (rows < N)[:, None] & (cols < K)[None, :]
        offs = (e * N + rows[:, None]).to(tl.int64) * K + cols[None, :]
        b = tl.load(bits_ptr + offs, mask=mask, other=0)
        m = tl.maximum(m, b.to(tl.int32) & ABS_MASK)
    return tl.max(tl.max(m, axis=1), axis=0)


@triton.jit
def announce_amax(
    bits_ptr,
    state_ptr,
    e,
    E,
    pid,
    P,
    N,
    K,
    ABS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    local = _expert_abs_bits(bits_ptr, e, pid, P, N, K, ABS_MASK, BLOCK_M, BLOCK_K)
    tl.atomic_max(state_ptr + e, local)
    tl.atomic_add(state_ptr + E + e, 1)  # acq_rel: the max above is visible before the count


@triton.jit
def quantize_expert(
    x_ptr,
    gd_ptr,
    codes_ptr,
    scales_ptr,
    ongrid_ptr,
    amax_bits,
    e,
    pid,
    P,
    N,
    K,
    one_sixth,
    BITS16: tl.constexpr,
    ONGRID: tl.constexpr,
    PACKED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    if BITS16:  # the 16-bit float whose bits these are, widened exactly
        amax = amax_bits.to(tl.int16).to(x_ptr.dtype.element_ty, bitcast=True).to(tl.float32)
    else:
        amax = amax_bits.to(tl.float32, bitcast=True)
    amax1 = tl.full((1,), 0.0, tl.float32) + amax  # |x| >= +0.0: adding +0.0 changes no bit
    gd1, mult1 = scales_from_amax(amax1, amax1 != amax1, one_sixth, 1)
    gd = tl.reshape(gd1, (1, 1))
    mult = tl.reshape(mult1, (1, 1))
    if pid == 0:
        tl.store(gd_ptr + e + tl.arange(0, 1), gd1)
    NB: tl.constexpr = BLOCK_K // 16
    tiles_k = tl.cdiv(K, BLOCK_K)
    for t in range(pid, tl.cdiv(N, BLOCK_M) * tiles_k, P):
        tm = t // tiles_k
        pid_k = t - tm * tiles_k
        local = tm * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = local < N
        rows = e * N + local  # rows of the flattened [E * N, K]
        blk = pid_k * NB + tl.arange(0, NB)
        rows3 = rows[:, None, None].to(tl.int64)
        cols3 = blk[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
        mask = rmask[:, None, None] & (cols3 < K)
        x = tl.load(x_ptr + rows3 * K + cols3, mask=mask, other=0.0).to(tl.float32)
        vmax = tile16_max(tl.max(tl.abs(x), axis=2), BLOCK_M, NB)
        s_code, s_val, enc = block_encode(vmax, mult, gd)
        v = tl.minimum(tl.maximum(x * enc[:, :, None], -6.0), 6.0)
        mag = tl.abs(v)
        if ONGRID:
            val = signed_value(rne_ongrid_magnitude(mag), v, s_val)
            tl.store(ongrid_ptr + rows3 * K + cols3, val.to(ongrid_ptr.dtype.element_ty), mask=mask)
        if PACKED:
            y, base = e2m1_scaled(mag)
            n, _n_f = rne_integer(y)
            idx = tl.where(mag == mag, base + n, 0)  # NaN -> code 0, as `_quantize_kernel`
            code = idx | ((v < 0.0).to(tl.int32) << 3)
            store_packed(
                codes_ptr,
                scales_ptr,
                code,
                s_code,
                rows.to(tl.int64),
                rmask,
                pid_k,
                blk,
                K,
                BLOCK_M,
                BLOCK_K,
            )
