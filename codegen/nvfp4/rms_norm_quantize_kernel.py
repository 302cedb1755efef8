"""Triton kernel: RMSNorm with its NVFP4 GEMM operand in the epilogue (imports triton).

Shape legend: M rows (tokens), H hidden (a multiple of 16), NB = BLOCK_H / 16 blocks of a row.

One program owns whole rows, so the row's amax, hence its per-row global scale, is known before
any block is encoded. Per row:
1. y = RMSNorm(x) * weight: `invariant.rms_norm_kernel.rms_norm_row` itself, launched with the
   norm's own (BLOCK_H, rows per program, warps) (`rms_norm_launch`): the same reduction, the
   same bits as `fp4_compile::invariant_rms_norm`; y is stored (the graph reads it too).
2. After a barrier the program reads its rows of y back (from cache: it just wrote them) as
   [1, NB, 16] blocks and quantizes them as `quantize_kernel._quantize_kernel` does with a
   per-row global scale and RNE: amax = max |y| (NaN flagged), (global decode, multiplier) by
   `scales_from_amax`, block scales by `block_encode`, on-grid values by `rne_ongrid_magnitude`
   and `signed_value` (the same helpers, the same FP32 operations).
Compiled with the norm's options (FP contraction left on, as `rms_norm`'s launch: its row sum
of squares may contract into FMAs, and must contract alike); the quantize steps hold no multiply
feeding an add, so `runtime.compile_options`' no-contraction setting of the quantize kernel
changes nothing there.
Outputs: y [M, H] in x's dtype, on-grid BF16 [M, H], global decode FP32 [M], and the row maxima
FP32 [M] (NaN where the row holds one, as `abs_max_kernel.row_abs_max`), from which the wgrad's
per-tensor X^T scale is one small max instead of another read of y.
Under the Triton interpreter, x must be float32 (its fp32 -> bf16 casts truncate).
The residual form (`add_rms_norm_quantize`: a decoder layer's residual add feeding its norm)
sums x + residual in step 1 (`rms_norm_row`'s HAS_RES: the FP32 sum rounded once to x's dtype,
Inductor's add) and stores that h too: no separate add kernel.

Few rows (fewer than `configs.LAUNCH`'s split_rows_below: at batch 1 the one-launch form is ONE
program normalizing and quantizing the whole row) take the split form, the same bits:
`_rms_norm_amax_kernel` runs step 1 (the same `rms_norm_row` at the same launch) and stores each
row's max |y| (NaN flagged) instead of quantizing; `row_codes_kernel` then quantizes y over
(row blocks, column chunks) from those maxima.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch
from ..invariant.rms_norm_kernel import rms_norm_launch, rms_norm_row
from ..runtime import check_kernel_device, interpreting, kernel_target
from ..triton_helpers import (
    ONE_SIXTH_F32,
    block_encode,
    rne_ongrid_magnitude,
    scales_from_amax,
    signed_value,
)
from .row_codes_kernel import row_codes_from_parts


@triton.jit
def _quantize_row(y_ptr, ongrid_ptr, gd_ptr, amax_ptr, row, R, H, one_sixth, BLOCK_H: tl.constexpr):
    NB: tl.constexpr = BLOCK_H // 16
    cols3 = tl.arange(0, NB)[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]  # [1, NB, 16]
    live = (cols3 < H) & ((cols3 * 0 + row) < R)
    y = tl.load(y_ptr + row * H + cols3, mask=live, other=0.0).to(tl.float32)
    absy = tl.abs(y)
    vmax = tl.max(absy, axis=2)  # [1, NB]
    amax = tl.max(vmax, axis=1)  # [1]
    nan = tl.max(tl.max((y != y).to(tl.int32), axis=2), axis=1)
    gd, mult = scales_from_amax(amax, nan > 0, one_sixth, 1)
    s_code, s_val, enc = block_encode(vmax, mult[:, None], gd[:, None])
    v = tl.minimum(tl.maximum(y * enc[:, :, None], -6.0), 6.0)
    val = signed_value(rne_ongrid_magnitude(tl.abs(v)), v, s_val)
    tl.store(ongrid_ptr + row * H + cols3, val.to(ongrid_ptr.dtype.element_ty), mask=live)
    one = tl.arange(0, 1)
    first = (one + row) < R
    tl.store(gd_ptr + row + one, gd, mask=first)
    tl.store(amax_ptr + row + one, tl.where(nan > 0, float("nan"), amax), mask=first)


@triton.jit
def _rms_norm_quantize_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    ongrid_ptr,
    gd_ptr,
    amax_ptr,
    R,
    H,
    eps,
    one_sixth,
    HAS_RES: tl.constexpr,
    HAS_W: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,
):
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        rms_norm_row(
            x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, row, R, H, eps, HAS_RES, HAS_W, True, BLOCK_H
        )
    tl.debug_barrier()  # this program's rows of y, stored by all its threads, are read back
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        _quantize_row(y_ptr, ongrid_ptr, gd_ptr, amax_ptr, row, R, H, one_sixth, BLOCK_H)


@triton.jit
def row_abs_max_part(y_ptr, part_ptr, row, R, H, BLOCK_H: tl.constexpr):
    """Row `row` of y [R, H] (stored by this program, behind a barrier) -> its max |y| into
    part_ptr[row] (FP32, NaN where the row holds one): the split form's row maxima, also
    written by `moe/combine_add_rms_norm_kernel`'s parts form."""
    cols = tl.arange(0, BLOCK_H)[None, :]  # [1, BLOCK_H]
    live = (cols < H) & ((cols * 0 + row) < R)
    y = tl.load(y_ptr + row * H + cols, mask=live, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(y), axis=1)  # [1]
    nan = tl.max((y != y).to(tl.int32), axis=1)
    one = tl.arange(0, 1)
    tl.store(part_ptr + row + one, tl.where(nan > 0, float("nan"), amax), mask=(one + row) < R)


@triton.jit
def _rms_norm_amax_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    part_ptr,
    R,
    H,
    eps,
    HAS_RES: tl.constexpr,
    HAS_W: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,
):
    # step 1 of the split form: the norm's rows, then each row's max |y| (NaN where it holds one)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        rms_norm_row(
            x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, row, R, H, eps, HAS_RES, HAS_W, True, BLOCK_H
        )
    tl.debug_barrier()  # this program's rows of y, stored by all its threads, are read back
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        row_abs_max_part(y_ptr, part_ptr, row, R, H, BLOCK_H)


def rms_norm_quantize(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, *, split: bool | None = None
):
    """x [..., H] -> (y [M, H] in x's dtype, on-grid BF16 [M, H], global decode FP32 [M, 1],
    row maxima FP32 [M]) in one launch, or for few rows in the split form's two (module
    docstring; the same bits). split: force the form (tests); None = `configs.LAUNCH`'s
    split_rows_below."""
    y, ongrid, gd, amax, _ = _launch(x, None, weight, eps, split)
    return y, ongrid, gd, amax


def add_rms_norm_quantize(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    *,
    split: bool | None = None,
):
    """The residual form: h = x + residual (FP32 sum rounded once to x's dtype, as Inductor's
    add of the two; `rms_norm_row`'s HAS_RES), stored, then `rms_norm_quantize` of h in the same
    launch(es). -> (y, on-grid, global decode, row maxima, h [M, H])."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must match x ({tuple(x.shape)}, {x.dtype}), "
            f"got {tuple(residual.shape)}, {residual.dtype}"
        )
    return _launch(x, residual, weight, eps, split)


def rms_norm_amax(x: torch.Tensor, residual: torch.Tensor | None, weight, eps: float):
    """The split form's first launch alone, at any row count: (y [M, H], row maxima FP32 [M, 1]
    (NaN where the row holds one), h [M, H] (x + residual; x itself without one)): y and h are
    `add_rms_norm_quantize`'s / `rms_norm_quantize`'s bit for bit, and (y, maxima) are
    `row_codes_from_parts`' arguments, which the decode GEMM's prologue reads instead of the
    codes (`nvfp4/norm_parts.py`)."""
    y, _, _, parts, h = _launch(x, residual, weight, eps, True, codes=False)
    return y, parts, h


def _launch(x, residual, weight, eps: float, split: bool | None, *, codes: bool = True):
    check_kernel_device(x, "x")
    hdim = x.shape[-1]
    if hdim % 16:
        raise ValueError(f"x last dim must be a multiple of 16, got {hdim}")
    if interpreting() and x.dtype != torch.float32:
        raise ValueError(
            f"x must be float32 under the Triton interpreter (its bf16 casts truncate), "
            f"got {x.dtype}"
        )
    x2 = x.reshape(-1, hdim).contiguous()
    m = x2.shape[0]
    dev = x.device
    y = torch.empty_like(x2)
    r2 = x2 if residual is None else residual.reshape(-1, hdim).contiguous()
    h = x2 if residual is None else torch.empty_like(x2)
    block, rows, warps = rms_norm_launch(hdim)
    target = kernel_target(x)
    if split is None:
        split = m < pick_launch(target.arch, "rms_norm_quantize")["split_rows_below"]
    w = weight if weight is not None else x2
    common = dict(
        HAS_RES=residual is not None,
        HAS_W=weight is not None,
        BLOCK_H=block,
        ROWS=rows,
        num_warps=warps,
    )
    if split:
        parts = torch.empty((m, 1), dtype=torch.float32, device=dev)
        if m:
            grid = (triton.cdiv(m, rows),)
            _rms_norm_amax_kernel[grid](x2, r2, w, y, h, parts, m, hdim, eps, **common)
        if not codes:
            return y, None, None, parts, h
        ongrid, gd, amax = row_codes_from_parts(y, parts, target=target)
        return y, ongrid, gd.reshape(m, 1), amax, h
    ongrid = torch.empty((m, hdim), dtype=torch.bfloat16, device=dev)
    gd = torch.empty((m,), dtype=torch.float32, device=dev)
    amax = torch.empty((m,), dtype=torch.float32, device=dev)
    if m:
        _rms_norm_quantize_kernel[(triton.cdiv(m, rows),)](
            x2, r2, w, y, h, ongrid, gd, amax, m, hdim, eps, ONE_SIXTH_F32, **common
        )
    return y, ongrid, gd.reshape(m, 1), amax, h
