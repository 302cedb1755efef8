"""Triton kernel of `fp4_compile::invariant_rms_norm_pair_rotary` (an attention's q and k norms
and the rotary embedding after them, one launch) and its launcher.

Shape legend: R rows (B x T x heads, the input's order), H head dim (even), T positions.

Each row: the sum of squares and the scale exactly as `rms_norm_kernel.rms_norm_row` computes
them (the same `tl.sum` over the same BLOCK_H / warps of `rms_norm_launch`, so the same order),
the norm's two roundings (y to the dtype, y * weight to the dtype), then the rotary's three:
y * cos, rotate_half(y) * sin, and their sum, each rounded to the dtype (`round_bf16`: round to
nearest even with integer ops, exact on sm_90 and in the interpreter, whose casts truncate; a
rounded operand also keeps the GPU from fusing a multiply into the add). rotate_half(y) needs
the row's other half: the kernel loads x at the rotated columns too and normalizes it with the
same scale, so those values are the norm's own, element for element. bf16 rows only (the pass
fuses bf16 graphs): `round_bf16` is the bf16 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import check_kernel_device, row_blocks
from ..triton_helpers import round_bf16_keep_nan
from .rms_norm_kernel import rms_norm_launch, rms_scale


@triton.jit
def _norm_rotary_row(
    x_ptr, w_ptr, c_ptr, s_ptr, y_ptr, row, R, H, heads, T, c_bstride, eps, scaling, HAS_W: tl.constexpr, BLOCK_H: tl.constexpr
):  # fmt: skip
    cols = tl.arange(0, BLOCK_H)
    live = (cols < H) & ((cols * 0 + row) < R)  # (row < R as a vector: the interpreter's masks)
    h = tl.load(x_ptr + row * H + cols, mask=live, other=0.0)
    h32 = h.to(tl.float32)
    scale = rms_scale(h32, H, eps)  # rms_norm_row's own reduction and scale
    y = round_bf16_keep_nan(h32 * scale)
    half = H // 2
    first = cols < half
    rot = tl.where(first, cols + half, cols - half)  # rotate_half's source column
    hr32 = tl.load(x_ptr + row * H + rot, mask=live, other=0.0).to(tl.float32)
    yr = round_bf16_keep_nan(hr32 * scale)  # the same scale: the norm's own values
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + rot, mask=live, other=0.0).to(tl.float32)
        y = round_bf16_keep_nan(y * w)
        yr = round_bf16_keep_nan(yr * wr)
    yr = tl.where(first, -yr, yr)  # cat(-y[H/2:], y[:H/2]); the negation is exact
    pos = row // heads  # b * T + t
    tab = (pos // T) * c_bstride + (pos % T) * H  # the row of cos / sin (c_bstride 0: one set)
    # the tables as the rotary embedding finishes them: (t * scaling).to(dtype), in FP32
    c = round_bf16_keep_nan(
        tl.load(c_ptr + tab + cols, mask=live, other=0.0).to(tl.float32) * scaling
    )
    s = round_bf16_keep_nan(
        tl.load(s_ptr + tab + cols, mask=live, other=0.0).to(tl.float32) * scaling
    )
    out = round_bf16_keep_nan(round_bf16_keep_nan(y * c) + round_bf16_keep_nan(yr * s))
    # stored heads first ([B, heads, T, H]: the model's transpose(1, 2), contiguous)
    out_row = ((pos // T) * heads + row % heads) * T + pos % T
    tl.store(y_ptr + out_row * H + cols, out.to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def _rms_norm_pair_rotary_kernel(
    a_ptr,
    wa_ptr,
    ya_ptr,
    b_ptr,
    wb_ptr,
    yb_ptr,
    c_ptr,
    s_ptr,
    RA,
    RB,
    H,
    heads_a,
    heads_b,
    T,
    c_bstride,
    eps,
    scaling,
    HAS_W: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,
    a_block_rows=1,
    a_block_stride=0,
    A_BLOCKS: tl.constexpr = False,
    b_block_rows=1,
    b_block_stride=0,
    B_BLOCKS: tl.constexpr = False,
):
    # the first cdiv(RA, ROWS) programs run a's rows, the rest b's (`_rms_norm_pair_kernel`'s
    # split); A_BLOCKS / B_BLOCKS: rows in blocks read in place (a fused q/k/v GEMM's q and k)
    pid = tl.program_id(0).to(tl.int64)
    programs_a = tl.cdiv(RA, ROWS)
    if pid < programs_a:
        for r in tl.static_range(ROWS):
            row = pid * ROWS + r
            a_row_ptr = a_ptr
            if A_BLOCKS:
                a_row_ptr = a_ptr + (row // a_block_rows) * (a_block_stride - a_block_rows * H)
            _norm_rotary_row(
                a_row_ptr,
                wa_ptr,
                c_ptr,
                s_ptr,
                ya_ptr,
                row,
                RA,
                H,
                heads_a,
                T,
                c_bstride,
                eps,
                scaling,
                HAS_W,
                BLOCK_H,
            )
    else:
        for r in tl.static_range(ROWS):
            row = (pid - programs_a) * ROWS + r
            b_row_ptr = b_ptr
            if B_BLOCKS:
                b_row_ptr = b_ptr + (row // b_block_rows) * (b_block_stride - b_block_rows * H)
            _norm_rotary_row(
                b_row_ptr,
                wb_ptr,
                c_ptr,
                s_ptr,
                yb_ptr,
                row,
                RB,
                H,
                heads_b,
                T,
                c_bstride,
                eps,
                scaling,
                HAS_W,
                BLOCK_H,
            )


def _rows_of(x: torch.Tensor, hdim: int):
    """x as the kernel reads it: in place where its rows lie in blocks (`runtime.row_blocks`),
    else [R, H] contiguous; with the (block rows, stride) or None."""
    blocks = row_blocks(x)
    return (x if blocks is not None else x.reshape(-1, hdim).contiguous()), blocks


def rms_norm_pair_rotary(a, a_weight, b, b_weight, eps: float, cos, sin, scaling: float):
    """(q_embed, k_embed) of `invariant_rms_norm_pair_rotary` in one launch: a [B, T, Ha, H],
    b [B, T, Hb, H], cos / sin [B | 1, T, H] (FP32 or bf16, scaled and rounded to bf16 here) ->
    [B, Ha, T, H], [B, Hb, T, H] contiguous; each row
    bitwise as `rms_norm` then the rotary's torch ops compute it (bf16)."""
    for name, t in (("a", a), ("b", b), ("cos", cos), ("sin", sin)):
        check_kernel_device(t, name)
    if a.dtype != torch.bfloat16:
        raise TypeError(f"rms_norm_pair_rotary's kernel is for bfloat16 rows, got {a.dtype}")
    hdim = a.shape[-1]
    a2, blocks_a = _rows_of(a, hdim)
    b2, blocks_b = _rows_of(b, hdim)
    c2, s2 = cos.reshape(-1, hdim).contiguous(), sin.reshape(-1, hdim).contiguous()
    rows_a, rows_b = a.numel() // hdim if hdim else 0, b.numel() // hdim if hdim else 0
    ya = torch.empty((rows_a, hdim), dtype=a.dtype, device=a.device)
    yb = torch.empty((rows_b, hdim), dtype=b.dtype, device=b.device)
    block, rows, warps = rms_norm_launch(hdim)
    grid = (triton.cdiv(rows_a, rows) + triton.cdiv(rows_b, rows),)
    if grid[0]:
        _rms_norm_pair_rotary_kernel[grid](
            a2,
            a_weight if a_weight is not None else a2,
            ya,
            b2,
            b_weight if b_weight is not None else b2,
            yb,
            c2,
            s2,
            rows_a,
            rows_b,
            hdim,
            a.shape[-2],
            b.shape[-2],
            a.shape[1],
            hdim * a.shape[1] if cos.shape[0] == a.shape[0] else 0,
            eps,
            float(scaling),
            HAS_W=a_weight is not None,
            BLOCK_H=block,
            ROWS=rows,
            a_block_rows=blocks_a[0] if blocks_a else 1,
            a_block_stride=blocks_a[1] if blocks_a else 0,
            A_BLOCKS=blocks_a is not None,
            b_block_rows=blocks_b[0] if blocks_b else 1,
            b_block_stride=blocks_b[1] if blocks_b else 0,
            B_BLOCKS=blocks_b is not None,
            num_warps=warps,
        )
    return ya.view(a.transpose(1, 2).shape), yb.view(b.transpose(1, 2).shape)
