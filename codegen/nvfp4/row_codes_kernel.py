"""Triton kernel: the per-row (1x16, RNE, on-grid) quantize of rows whose maxima arrive in parts,
split over column chunks so that a few wide rows fill the GPU (imports triton).

Shape legend: R rows, C columns (a multiple of 16), P partial maxima per row.

The fused kernels (`silu_mul_quantize_kernel`, `rms_norm_quantize_kernel`) own whole rows per
program; at batch 1 that is ONE program over a 12288-wide row. Their split form runs two launches:
1. the values (stored) and, per (row, column chunk), max |value| (NaN where the chunk holds one):
   the fused kernel's own first stage, tiled over columns too (for a plain per-row quantize
   of few rows, `quantize_kernel.quantize_triton`: the maxima alone, `abs_max_kernel.
   chunk_abs_max`);
2. this kernel, over (row blocks, column chunks of BLOCK_K): each program folds its rows' P
   partial maxima (max is exact in any order, so the fold order cannot change a bit), derives
   (global decode, multiplier) by `scales_from_amax`, and quantizes its chunk of the stored
   values as `quantize_kernel._quantize_kernel` does per row (`block_encode`,
   `rne_ongrid_magnitude`, `signed_value`: the same FP32 operations, hence the same bits); the
   programs of chunk 0 store the rows' global decode and maxima (NaN where the row holds one).
Compiled without FP contraction (`runtime.compile_options`), as the quantize kernels.
The fold (`row_scales_from_parts`) and the block quantize (`ongrid_blocks`) are jit helpers that
the decode GEMM's prologue calls too (`decode_gemm_prologue.py`: the GEMM quantizes its A operand
itself, no row_codes launch before it): one piece of code, so the two forms' bits are equal by
construction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import KernelTarget
from ..triton_helpers import (
    ONE_SIXTH_F32,
    block_encode,
    rne_ongrid_magnitude,
    scales_from_amax,
    signed_value,
)


@triton.jit
def row_scales_from_parts(
    part_ptr, rows, rmask, P, one_sixth, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr
):
    """Rows `rows` (int64 [BLOCK_R], live where rmask) of parts [R, P] (contiguous) -> (global
    decode, multiplier, the row maxima with NaN where a part holds one), FP32 [BLOCK_R]: the P
    partial maxima folded (max: exact in any order), then `scales_from_amax`."""
    amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
    nan = tl.zeros((BLOCK_R,), dtype=tl.int32)
    for p0 in range(0, P, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        pmask = rmask[:, None] & (parts < P)[None, :]
        v = tl.load(part_ptr + rows[:, None] * P + parts[None, :], mask=pmask, other=0.0)
        amax = tl.maximum(amax, tl.max(tl.where(pmask & (v == v), v, 0.0), axis=1))
        nan = tl.maximum(nan, tl.max((pmask & (v != v)).to(tl.int32), axis=1))
    gd, mult = scales_from_amax(amax, nan > 0, one_sixth, BLOCK_R)
    return gd, mult, tl.where(nan > 0, float("nan"), amax)


@triton.jit
def ongrid_blocks(x, mult, gd):
    """FP32 values x [BLOCK_R, NB, 16] (NB 16-blocks of each row) and their rows' multiplier and
    global decode [BLOCK_R] -> the on-grid values (FP32, exact in BF16): steps 5-8 of
    `reference.quantize` as `quantize_kernel._quantize_kernel` runs them per row."""
    vmax = tl.max(tl.abs(x), axis=2)  # [BLOCK_R, NB]
    s_code, s_val, enc = block_encode(vmax, mult[:, None], gd[:, None])
    v = tl.minimum(tl.maximum(x * enc[:, :, None], -6.0), 6.0)
    return signed_value(rne_ongrid_magnitude(tl.abs(v)), v, s_val)


@triton.jit
def _row_codes_kernel(
    y_ptr,
    part_ptr,
    ongrid_ptr,
    gd_ptr,
    amax_ptr,
    R,
    C,
    P,
    stride_yr,
    one_sixth,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < R
    gd, mult, amax = row_scales_from_parts(part_ptr, rows, rmask, P, one_sixth, BLOCK_R, BLOCK_P)
    first = rmask & (
        (rows * 0 + tl.program_id(1).to(tl.int64)) == 0
    )  # (as a vector: interpreter masks)
    tl.store(gd_ptr + rows, gd, mask=first)
    tl.store(amax_ptr + rows, amax, mask=first)
    NB: tl.constexpr = BLOCK_K // 16
    rows3 = rows[:, None, None]
    cols3 = (
        tl.program_id(1).to(tl.int64) * BLOCK_K
        + tl.arange(0, NB)[None, :, None] * 16
        + tl.arange(0, 16)[None, None, :]
    )
    mask3 = (rows3 < R) & (cols3 < C)
    x = tl.load(y_ptr + rows3 * stride_yr + cols3, mask=mask3, other=0.0).to(tl.float32)
    val = ongrid_blocks(x, mult, gd)
    tl.store(ongrid_ptr + rows3 * C + cols3, val.to(ongrid_ptr.dtype.element_ty), mask=mask3)


def row_codes_from_parts(
    y: torch.Tensor,
    parts: torch.Tensor,
    *,
    target: KernelTarget,
    ongrid_dtype: torch.dtype = torch.bfloat16,
):
    """y [R, C] (unit stride along C; the stored values), parts FP32 [R, P] (contiguous: max |y|
    over P column chunks, NaN where a chunk holds one) -> (on-grid [R, C] in ongrid_dtype,
    global decode FP32 [R], row maxima FP32 [R]), bitwise the per-row quantize of y (module
    docstring)."""
    r, c = y.shape
    assert (c <= 1 or y.stride(1) == 1) and parts.is_contiguous() and parts.shape[0] == r
    ongrid = torch.empty((r, c), dtype=ongrid_dtype, device=y.device)
    gd = torch.empty((r,), dtype=torch.float32, device=y.device)
    amax = torch.empty((r,), dtype=torch.float32, device=y.device)
    lc = pick_launch(target.arch, "row_codes")
    if r and c:
        grid = (triton.cdiv(r, lc["block_r"]), triton.cdiv(c, lc["block_k"]))
        _row_codes_kernel[grid](
            y,
            parts,
            ongrid,
            gd,
            amax,
            r,
            c,
            parts.shape[1],
            y.stride(0),
            ONE_SIXTH_F32,
            BLOCK_R=lc["block_r"],
            BLOCK_K=lc["block_k"],
            BLOCK_P=lc["block_p"],
            **warps_kwargs(lc),
            **target.options,
        )
    return ongrid, gd, amax
