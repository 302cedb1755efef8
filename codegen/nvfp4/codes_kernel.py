"""Steps 3-4 of the NVFP4 scale chain (`quantize_kernel.py` runs the chain): E4M3 block scales
and E2M1 codes in ONE Triton kernel, from the global decode and multiplier of steps 1-2.

Shape legend: R rows, K columns (a multiple of 16); a transposed operand: D rows (features),
C columns (tokens, in 16-aligned expert segments).

Bitwise `fp4_compile.reference.quantize` steps 5-8 (see its docstring): vec_max (max |x| over 16
elements or a 16x16 tile), ONE FP32 multiply by the multiplier, clamp to 448, E4M3
round-to-nearest-even with INTEGER bit operations (`e4m3_rne`: the interpreter's fp32->fp8 cast
is wrong, and integer code is the same on every backend), encode scale = min(div_rn(1, scale *
global_decode), FLT_MAX) with an IEEE-rounded division (Triton's `/` may be approximate on CUDA),
codes by the E2M1 RNE threshold table, or stochastic rounding given the reference's uniform
stream (`triton_helpers.sr_uniform`). Outputs: packed codes + E4M3 scale bytes, and/or the
on-grid values (E2M1 x E4M3, exact in BF16) that the GEMM kernels consume.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..runtime import KernelTarget
from ..triton_helpers import (
    block_encode,
    e2m1_magnitude,
    e2m1_scaled,
    rne_integer,
    rne_ongrid_magnitude,
    signed_value,
    sr_key_of,
    sr_uniform,
    sr_uniform32,
    store_packed,
    tile16_max,
)

FLAT32_LIMIT = 2**31  # flat SR indices below it: int32 arithmetic (tests lower it to cover int64)


@triton.jit(do_not_specialize=["sr_seed"])
def _quantize_kernel(
    x_ptr,
    mult_ptr,
    gd_ptr,
    codes_ptr,
    scales_ptr,
    ongrid_ptr,
    R,
    K,
    stride_xr,
    mult_stride,
    gd_stride,
    sr_seed,
    seed_ptr,
    seed_offset,
    group_ptr,
    seg_start_ptr,
    seg_width_ptr,
    group_stride,
    src_ptr,
    stride_xc,
    n_tok,
    TILE16: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    ONGRID: tl.constexpr,
    SEGMENTED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SEED_FROM_PTR: tl.constexpr = False,
    PACKED_TOO: tl.constexpr = False,
    ONE_SEGMENT: tl.constexpr = False,
    FLAT32: tl.constexpr = False,
):
    # FLAT32: every stochastic-rounding flat index is below 2**31: the stream is drawn with
    # int32 index arithmetic and one mixer round (`sr_uniform32`), the same bits.
    # ONGRID: store the on-grid values; else the packed codes and scale bytes. PACKED_TOO (with
    # ONGRID): both, from one read of x (a weight's packed form and its on-grid copy).
    # The SR seed: sr_seed (a host int), or SEED_FROM_PTR: seed_ptr[0] + seed_offset (a seed held
    # on the device: CUDA-graph replays, `sr_stream.DeviceSeed`). The key `sr_key(seed)` is
    # derived here, per program (two mixer rounds on a scalar; no key tensors, no launches).
    # SEGMENTED: the columns are groups laid end to end (16-aligned segments, one per expert);
    # group_ptr[b] is the group of 16-column block b. Global scales are per group (x per row:
    # mult[g * group_stride + row * mult_stride]), and the SR stream of a group is that of its
    # own [R, width] matrix: flat index row * width + (col - start), seed (seed + g). Column c
    # reads x[row, src[c]] (x strided: stride_xr, stride_xc), or zero where src[c] < 0: the
    # quantizer gathers and transposes tokens itself (no padded copy of the operand).
    # ONE_SEGMENT (with SEGMENTED): the layout of one segment of all K columns, column c token c
    # below n_tok (else zero), computed here instead of read from the layout tensors (the
    # dense wgrad's operands: no per-call tensors); keys as in the unsegmented path.
    # Tensors are [BLOCK_M, NB, 16] (NB = BLOCK_K // 16 blocks of 16 columns): the block max is a
    # reduction over the last axis and its scales broadcast back along it, in the same register
    # layout (no reshape, no shuffle through shared memory for the 1x16 path).
    NB: tl.constexpr = BLOCK_K // 16
    pid_m = tl.program_id(0).to(tl.int64)
    pid_k = tl.program_id(1)  # int32 index: a column block (< K), FLAT32 needs int32 columns
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    blk = pid_k * NB + tl.arange(0, NB)  # global 16-column block index [NB]
    rows3_64 = rows[:, None, None]  # int64 (the program id is): every pointer offset
    rows3 = rows3_64.to(tl.int32)  # the stochastic-rounding flat index below 2**31 (FLAT32)
    cols3 = blk[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]  # [1, NB, 16]
    rmask = rows < R
    mask = (rows3 < R) & (cols3 < K)
    if SEGMENTED:
        if ONE_SEGMENT:
            src = tl.where(cols3 < n_tok, cols3, -1).to(tl.int64)
        else:
            src = tl.load(src_ptr + cols3, mask=cols3 < K, other=-1)
        # (a token-major [BLOCK_K, BLOCK_M] load, transposed in registers, is slower on the
        # H200: benchmarks/results/2026-12-04_learner_1bb6149.md)
        x = tl.load(
            x_ptr + rows3_64 * stride_xr + src * stride_xc, mask=mask & (src >= 0), other=0.0
        )
    else:
        x = tl.load(x_ptr + rows3_64 * stride_xr + cols3, mask=mask, other=0.0)
    x = x.to(tl.float32)
    vmax = tl.max(tl.abs(x), axis=2)  # [BM, NB]
    if TILE16:
        vmax = tile16_max(vmax, BLOCK_M, NB)
    if SEGMENTED:
        bmask = rmask[:, None] & (blk < K // 16)[None, :]
        if ONE_SEGMENT:
            grp = tl.zeros_like(blk)
        else:
            grp = tl.load(group_ptr + blk, mask=blk < K // 16, other=0)
        goff = grp[None, :] * group_stride + rows[:, None] * mult_stride  # [BM, NB]
        mult = tl.load(mult_ptr + goff, mask=bmask, other=1.0)
        gd = tl.load(gd_ptr + goff, mask=bmask, other=1.0)
    else:
        mult = tl.load(mult_ptr + rows * mult_stride, mask=rmask, other=1.0)[:, None]
        gd = tl.load(gd_ptr + rows * gd_stride, mask=rmask, other=1.0)[:, None]
    s_code, s_val, enc = block_encode(vmax, mult, gd)  # [BM, NB]
    v = tl.minimum(tl.maximum(x * enc[:, :, None], -6.0), 6.0)
    mag = tl.abs(v)
    y, base = e2m1_scaled(mag)
    if STOCHASTIC:
        if SEED_FROM_PTR:
            seed0 = tl.load(seed_ptr) + seed_offset
        else:
            seed0 = sr_seed.to(tl.int64)
        if SEGMENTED and not ONE_SEGMENT:
            gblk = tl.load(group_ptr + blk, mask=blk < K // 16, other=0)[None, :, None]
            start = tl.load(seg_start_ptr + gblk)
            width = tl.load(seg_width_ptr + gblk)
            klo = sr_key_of(seed0 + gblk)
            khi = klo >> 1
            if FLAT32:
                flat = rows3 * width.to(tl.int32) + (cols3 - start.to(tl.int32))
                u = sr_uniform32(flat, klo)
            else:
                flat = rows3.to(tl.int64) * width + (cols3 - start)
                u = sr_uniform(flat, klo, khi)
        else:
            klo = sr_key_of(seed0)
            khi = klo >> 1
            if FLAT32:
                u = sr_uniform32(rows3 * K + cols3, klo)
            else:
                u = sr_uniform(rows3.to(tl.int64) * K + cols3, klo, khi)
        # the grid points around |v| are floor(y) and floor(y) + 1 (in units of the spacing), and
        # y - floor(y) is exactly the reference's (|v| - lo) / (hi - lo): round up when u < it
        # (|v| on the grid: 0, never up)
        lo = tl.floor(y)
        up = u < y - lo
        n = lo.to(tl.int32) + up.to(tl.int32)
        n_f = lo + up.to(tl.float32)  # the same integer as FP32 (exact)
    else:
        n, n_f = rne_integer(y)
    # NaN (the interpreter's clamp keeps it) compares false everywhere in the reference: code 0
    idx = tl.where(mag == mag, base + n, 0)
    code = idx | ((v < 0.0).to(tl.int32) << 3)
    if ONGRID:
        # |value| = n grid spacings (0.5, 1 or 2: `e2m1_scaled`), exact, = the magnitude of
        # E2M1 index base + n (`e2m1_magnitude`) without decoding the index; NaN -> code 0
        # (SR with the packed codes too: the index is at hand, decoding it is the shorter code)
        if PACKED_TOO and STOCHASTIC:
            mag_n = e2m1_magnitude(idx)
        elif STOCHASTIC:
            spacing = tl.where(mag < 2.0, 0.5, tl.where(mag < 4.0, 1.0, 2.0))
            mag_n = tl.where(mag == mag, n_f * spacing, 0.0)
        else:
            mag_n = rne_ongrid_magnitude(mag)
        val = signed_value(mag_n, v, s_val)
        tl.store(ongrid_ptr + rows3_64 * K + cols3, val.to(ongrid_ptr.dtype.element_ty), mask=mask)
    if PACKED_TOO or not ONGRID:
        store_packed(
            codes_ptr, scales_ptr, code, s_code, rows, rmask, pid_k, blk, K, BLOCK_M, BLOCK_K
        )


def launch_rows(
    x2,
    gd_rows,
    mult_rows,
    codes,
    scales,
    ongrid,
    *,
    per_row: bool,
    tile16: bool,
    seed_args,
    out: str,
    cfg,
    target: KernelTarget,
) -> None:
    """Steps 3-4 over x2 [R, K] (unit stride along K) into the given outputs: gd_rows /
    mult_rows FP32, one per row (per_row) or one for all; seed_args: `seed_launch_args`' triple,
    or None (RNE); out "packed", "ongrid" or "both"."""
    r, k = x2.shape
    if not (r and k):
        return
    host_seed, seed_t, seed_off = (0, None, 0) if seed_args is None else seed_args
    stride = 1 if per_row else 0
    grid = (triton.cdiv(r, cfg.block_m), triton.cdiv(k, cfg.block_k))
    _quantize_kernel[grid](
        x2,
        mult_rows,
        gd_rows,
        codes,
        scales,
        ongrid,
        r,
        k,
        x2.stride(0),
        stride,
        stride,
        host_seed,
        gd_rows if seed_t is None else seed_t,
        seed_off,
        gd_rows,
        gd_rows,
        gd_rows,
        0,
        gd_rows,
        0,
        0,  # no segments
        TILE16=tile16,
        STOCHASTIC=seed_args is not None,
        ONGRID=out != "packed",
        SEGMENTED=False,
        BLOCK_M=cfg.block_m,
        BLOCK_K=cfg.block_k,
        SEED_FROM_PTR=seed_t is not None,
        PACKED_TOO=out == "both",
        FLAT32=r * k < FLAT32_LIMIT,
        **cfg.launch_kwargs(),
        **target.options,
    )


def launch_transposed(
    x_TD, gd, mult, ongrid, *, per_row: bool, layout, seed_args, cfg, target: KernelTarget
) -> None:
    """Steps 3-4 of the transposed operand X [D, C] (column c: token src[c] of x [T, D], zeros
    where src[c] < 0) into `ongrid` [D, C]: gd / mult FP32 [G] or [G, D] (per_row: per row of
    X); layout (src, block_group, seg_start, seg_width), or None for one segment of all tokens
    (the kernel derives column c's token); seed_args: `seed_launch_args`' triple, or None."""
    r, c = ongrid.shape
    if not (r and c):
        return
    one = layout is None
    src, block_group, seg_start, seg_width = (gd, gd, gd, gd) if one else layout
    host_seed, seed_t, seed_off = (0, None, 0) if seed_args is None else seed_args
    grid = (triton.cdiv(r, cfg.block_m), triton.cdiv(c, cfg.block_k))
    _quantize_kernel[grid](
        x_TD,
        mult,
        gd,
        ongrid,
        ongrid,
        ongrid,
        r,
        c,
        x_TD.stride(1),
        1 if per_row else 0,
        0,
        host_seed,
        gd if seed_t is None else seed_t,
        seed_off,
        block_group,
        seg_start,
        seg_width,
        r if per_row else 1,
        src,
        x_TD.stride(0),
        x_TD.shape[0],
        TILE16=False,
        STOCHASTIC=seed_args is not None,
        ONGRID=True,
        SEGMENTED=True,
        BLOCK_M=cfg.block_m,
        BLOCK_K=cfg.block_k,
        ONE_SEGMENT=one,
        FLAT32=r * c < FLAT32_LIMIT,
        SEED_FROM_PTR=seed_t is not None,
        **cfg.launch_kwargs(),
        **target.options,
    )
