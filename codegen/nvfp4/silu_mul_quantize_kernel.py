"""Triton kernel: the SwiGLU silu(a) * b with its NVFP4 GEMM operand in the epilogue (imports
triton).

Shape legend: R rows (tokens), C columns (a multiple of 16); a and b have unit inner stride and
any row stride (the two halves of the experts' [R, 2C] gate_up output).

Each program owns BLOCK_R whole rows, so a row's amax, hence its per-row global scale, is known
before any block is encoded:
1. out = silu(a) * b over the row in BLOCK_C chunks: `invariant.silu_mul_kernel.silu_mul_values`,
   the forward kernel's own values (elementwise: the tiling changes no bit), stored (the graph's
   silu_mul output: the down GEMM's backward reads it); max |out| and a NaN flag kept per row
   (stored too: a wgrad's per-tensor X^T amax is their max, no further read of out).
2. (global decode, multiplier) per row by `scales_from_amax`; after a barrier the program reads
   its rows of out back (from cache) as [BLOCK_R, NB, 16] blocks and quantizes them as
   `quantize_kernel._quantize_kernel` does (per-row scales, RNE, on-grid output): the same
   helpers, the same FP32 operations.
Row mask: rows r with mask[r] != 0 read a and b as zeros (`silu_mul`'s row_mask).
Compiled without FP contraction (`runtime.compile_options`), as both unfused kernels.

Few rows (fewer than `configs.LAUNCH`'s split_rows_below: at batch 1 the one-launch form is ONE
program over the row) take the split form instead, the same bits: `_silu_mul_parts_kernel`, over
tiles of split_block_r rows x split_block_c columns, computes and stores out as step 1 does, and
each tile row's max |out| (NaN where it holds one); `row_codes_kernel` folds those maxima (max:
exact in any order) and quantizes out over (row blocks, column chunks). The one-launch form stays
for many rows, where it reads out back from cache instead of memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..invariant.silu_mul_kernel import silu_mul_values
from ..runtime import check_kernel_device, interpreting, kernel_target, row_mask_bytes
from ..triton_helpers import (
    ONE_SIXTH_F32,
    block_encode,
    rne_ongrid_magnitude,
    scales_from_amax,
    signed_value,
)
from .row_codes_kernel import row_codes_from_parts


@triton.jit
def _silu_mul_quantize_kernel(
    a_ptr,
    b_ptr,
    o_ptr,
    ongrid_ptr,
    gd_ptr,
    amax_ptr,
    m_ptr,
    R,
    C,
    sa,
    sb,
    one_sixth,
    BF16: tl.constexpr,
    INTERP: tl.constexpr,
    ROW_MASK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    keep = rmask
    if ROW_MASK:
        keep = rmask & (tl.load(m_ptr + rows, mask=rmask, other=1) == 0)
    amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
    nan = tl.zeros((BLOCK_R,), dtype=tl.int32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        mask = rmask[:, None] & (cols < C)[None, :]
        lmask = keep[:, None] & (cols < C)[None, :]
        a = tl.load(a_ptr + rows[:, None] * sa + cols[None, :], mask=lmask, other=0.0)
        b = tl.load(b_ptr + rows[:, None] * sb + cols[None, :], mask=lmask, other=0.0)
        out = silu_mul_values(a.to(tl.float32), b.to(tl.float32), BF16, INTERP)
        tl.store(
            o_ptr + rows[:, None] * C + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=mask
        )
        amax = tl.maximum(amax, tl.max(tl.where(mask, tl.abs(out), 0.0), axis=1))
        nan = tl.maximum(nan, tl.max((mask & (out != out)).to(tl.int32), axis=1))
    gd, mult = scales_from_amax(amax, nan > 0, one_sixth, BLOCK_R)
    tl.store(gd_ptr + rows, gd, mask=rmask)
    tl.store(amax_ptr + rows, tl.where(nan > 0, float("nan"), amax), mask=rmask)
    tl.debug_barrier()  # this program's rows of out, stored by all its threads, are read back
    NB: tl.constexpr = BLOCK_K // 16
    rows3 = rows[:, None, None]
    for k0 in range(0, C, BLOCK_K):
        cols3 = k0 + tl.arange(0, NB)[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
        mask3 = (rows3 < R) & (cols3 < C)
        x = tl.load(o_ptr + rows3 * C + cols3, mask=mask3, other=0.0).to(tl.float32)
        vmax = tl.max(tl.abs(x), axis=2)  # [BLOCK_R, NB]
        s_code, s_val, enc = block_encode(vmax, mult[:, None], gd[:, None])
        v = tl.minimum(tl.maximum(x * enc[:, :, None], -6.0), 6.0)
        val = signed_value(rne_ongrid_magnitude(tl.abs(v)), v, s_val)
        tl.store(ongrid_ptr + rows3 * C + cols3, val.to(ongrid_ptr.dtype.element_ty), mask=mask3)


@triton.jit
def _silu_mul_parts_kernel(
    a_ptr,
    b_ptr,
    o_ptr,
    part_ptr,
    m_ptr,
    R,
    C,
    P,
    sa,
    sb,
    BF16: tl.constexpr,
    INTERP: tl.constexpr,
    ROW_MASK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # step 1 of the split form: one [BLOCK_R, BLOCK_C] tile of out and its rows' chunk maxima
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < R
    keep = rmask
    if ROW_MASK:
        keep = rmask & (tl.load(m_ptr + rows, mask=rmask, other=1) == 0)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = rmask[:, None] & (cols < C)[None, :]
    lmask = keep[:, None] & (cols < C)[None, :]
    a = tl.load(a_ptr + rows[:, None] * sa + cols[None, :], mask=lmask, other=0.0)
    b = tl.load(b_ptr + rows[:, None] * sb + cols[None, :], mask=lmask, other=0.0)
    out = silu_mul_values(a.to(tl.float32), b.to(tl.float32), BF16, INTERP)
    tl.store(o_ptr + rows[:, None] * C + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=mask)
    amax = tl.max(tl.where(mask, tl.abs(out), 0.0), axis=1)
    nan = tl.max((mask & (out != out)).to(tl.int32), axis=1)
    tl.store(
        part_ptr + rows * P + tl.program_id(1).to(tl.int64),
        tl.where(nan > 0, float("nan"), amax),
        mask=rmask,
    )


def silu_mul_quantize(
    a: torch.Tensor,
    b: torch.Tensor,
    row_mask: torch.Tensor | None = None,
    *,
    split: bool | None = None,
    codes: bool = True,
    parts_block_c: int | None = None,
):
    """a, b [R, C] (unit inner stride, any row stride; bf16 or FP32) -> (silu(a) * b [R, C] in
    a's dtype, its on-grid BF16 operand [R, C], per-row global decode FP32 [R, 1], row maxima
    FP32 [R] (NaN where the row holds one, as `abs_max_kernel.row_abs_max`)) in one launch, or
    for few rows in the split form's two (module docstring; the same bits). split: force the
    form (tests); None = `configs.LAUNCH`'s split_rows_below. codes=False (with split): the
    split form's first launch alone, -> (y, None, None, the chunk maxima FP32 [R, P]) with P =
    cdiv(C, parts_block_c or the launch table's split_block_c): `row_codes_from_parts`'
    arguments, which the decode GEMM's prologue reads instead (`nvfp4/silu_mul_parts.py`)."""
    check_kernel_device(a, "a")
    if a.dim() != 2 or a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a and b must be [R, C] of one dtype, got {a.shape} and {b.shape}")
    if a.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"a must be bfloat16 or float32, got {a.dtype}")
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("a and b must have a unit stride along their last dim")
    r, c = a.shape
    if c % 16:
        raise ValueError(f"a last dim must be a multiple of 16, got {c}")
    m = row_mask_bytes(row_mask, r)
    out = torch.empty((r, c), dtype=a.dtype, device=a.device)
    target = kernel_target(a)
    lc = pick_launch(target.arch, "silu_mul_quantize")
    block_r, block_c, block_k = lc["block_r"], lc["block_c"], lc["block_k"]
    if split is None:
        split = r < lc["split_rows_below"]
    if split:
        tile_r, tile_c = lc["split_block_r"], parts_block_c or lc["split_block_c"]
        parts = torch.empty((r, triton.cdiv(c, tile_c)), dtype=torch.float32, device=a.device)
        if r and c:
            _silu_mul_parts_kernel[(triton.cdiv(r, tile_r), parts.shape[1])](
                a,
                b,
                out,
                parts,
                m if m is not None else parts,
                r,
                c,
                parts.shape[1],
                a.stride(0),
                b.stride(0),
                BF16=a.dtype == torch.bfloat16,
                INTERP=interpreting(),
                ROW_MASK=m is not None,
                BLOCK_R=tile_r,
                BLOCK_C=tile_c,
                **warps_kwargs(lc),
                **target.options,
            )
        if not codes:
            return out, None, None, parts
        ongrid, gd, amax = row_codes_from_parts(out, parts, target=target)
        return out, ongrid, gd.reshape(r, 1), amax
    ongrid = torch.empty((r, c), dtype=torch.bfloat16, device=a.device)
    gd = torch.empty((r,), dtype=torch.float32, device=a.device)
    amax = torch.empty((r,), dtype=torch.float32, device=a.device)
    if r and c:
        _silu_mul_quantize_kernel[(triton.cdiv(r, block_r),)](
            a,
            b,
            out,
            ongrid,
            gd,
            amax,
            m if m is not None else gd,
            r,
            c,
            a.stride(0),
            b.stride(0),
            ONE_SIXTH_F32,
            BF16=a.dtype == torch.bfloat16,
            INTERP=interpreting(),
            ROW_MASK=m is not None,
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            BLOCK_K=block_k,
            **warps_kwargs(lc),
            **target.options,
        )
    return out, ongrid, gd.reshape(r, 1), amax
