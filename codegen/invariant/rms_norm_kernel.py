"""Triton kernel of `fp4_compile::invariant_rms_norm` / `invariant_add_rms_norm`'s forward, and
its launcher; `rms_norm_row` is also the first step of `nvfp4/rms_norm_quantize_kernel.py`.

Shape legend: R rows, H hidden.

Invariance: one row at a time (ROWS rows per program, one after the other), the row's sum of
squares one `tl.sum` whose order depends on BLOCK_H only, a function of H (`rms_norm_launch`).
Interpreter: the kernel hands its FP32 result to torch for the final roundings (fp32 -> bf16
casts truncate there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch
from ..runtime import check_kernel_device, interpreting, row_blocks


@triton.jit
def rms_scale(h32, H, eps):
    """1 / sqrt(mean(h32^2) + eps) of one FP32 row [BLOCK_H] (zeros past H): one `tl.sum` whose
    order depends on BLOCK_H only (one row at a time: the order never follows M). Every RMSNorm
    kernel's scale (`rms_norm_values`, `rms_norm_rotary_kernel`)."""
    var = tl.sum(h32 * h32, axis=0) / H
    return 1.0 / tl.sqrt_rn(var + eps)


@triton.jit
def rms_norm_row(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    row,
    R,
    H,
    eps,
    HAS_RES: tl.constexpr,
    HAS_W: tl.constexpr,
    FINISH: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_H)
    live = (cols < H) & ((cols * 0 + row) < R)  # (row < R as a vector: the interpreter's masks)
    h = tl.load(x_ptr + row * H + cols, mask=live, other=0.0)
    rms_norm_values(h, r_ptr, w_ptr, y_ptr, h_ptr, row, H, eps, cols, live, HAS_RES, HAS_W, FINISH)


@triton.jit
def rms_norm_values(
    h,
    r_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    row,
    H,
    eps,
    cols,
    live,
    HAS_RES: tl.constexpr,
    HAS_W: tl.constexpr,
    FINISH: tl.constexpr,
):
    """`rms_norm_row` after its load of x's row (h, [BLOCK_H] in x's dtype): also the end of
    `moe/combine_add_rms_norm_kernel`, whose x is the MoE combine computed in its prologue."""
    if HAS_RES:  # sum in x's dtype, as the model adds it
        h = (
            h.to(tl.float32) + tl.load(r_ptr + row * H + cols, mask=live, other=0.0).to(tl.float32)
        ).to(h.dtype)
        tl.store(h_ptr + row * H + cols, h, mask=live)
    h32 = h.to(tl.float32)
    y = h32 * rms_scale(h32, H, eps)
    if FINISH:
        y = y.to(y_ptr.dtype.element_ty)
        if HAS_W:
            w = tl.load(w_ptr + cols, mask=live, other=0.0)
            y = (y.to(tl.float32) * w.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * H + cols, y, mask=live)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    R,
    H,
    eps,
    HAS_RES: tl.constexpr,
    HAS_W: tl.constexpr,
    FINISH: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr = 1,
    x_block_rows=1,
    x_block_stride=0,
    X_BLOCKS: tl.constexpr = False,
):
    # ROWS rows per program, one after the other with the one-row code (the same reduction,
    # instruction for instruction; short rows such as the q / k norms' 128 columns otherwise
    # make one tiny program per row: [131072, 128] took 80 us on the H200)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        x_row_ptr = x_ptr
        if X_BLOCKS:  # x's rows in blocks (`runtime.row_blocks`): row r of block b at b*stride +
            # (r % I)*H, which is rms_norm_row's row*H plus b*(stride - I*H) (>= 0)
            x_row_ptr = x_ptr + (row // x_block_rows) * (x_block_stride - x_block_rows * H)
        rms_norm_row(
            x_row_ptr, r_ptr, w_ptr, y_ptr, h_ptr, row, R, H, eps, HAS_RES, HAS_W, FINISH, BLOCK_H
        )


@triton.jit
def _rms_norm_pair_kernel(
    a_ptr,
    wa_ptr,
    ya_ptr,
    b_ptr,
    wb_ptr,
    yb_ptr,
    RA,
    RB,
    H,
    eps,
    HAS_W: tl.constexpr,
    FINISH: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,
    a_block_rows=1,
    a_block_stride=0,
    A_BLOCKS: tl.constexpr = False,
    b_block_rows=1,
    b_block_stride=0,
    B_BLOCKS: tl.constexpr = False,
):
    # `invariant_rms_norm_pair`: the first cdiv(RA, ROWS) programs are `_rms_norm_kernel`'s on
    # a, the rest its programs on b (each row the one-row code, instruction for instruction);
    # A_BLOCKS / B_BLOCKS: that input's rows in blocks, read in place as `_rms_norm_kernel`'s
    # X_BLOCKS (a fused q/k/v GEMM's q and k at batch > 1)
    pid = tl.program_id(0).to(tl.int64)
    programs_a = tl.cdiv(RA, ROWS)
    if pid < programs_a:
        for r in tl.static_range(ROWS):
            row = pid * ROWS + r
            a_row_ptr = a_ptr
            if A_BLOCKS:
                a_row_ptr = a_ptr + (row // a_block_rows) * (a_block_stride - a_block_rows * H)
            rms_norm_row(
                a_row_ptr,
                a_row_ptr,
                wa_ptr,
                ya_ptr,
                ya_ptr,
                row,
                RA,
                H,
                eps,
                False,
                HAS_W,
                FINISH,
                BLOCK_H,
            )
    else:
        for r in tl.static_range(ROWS):
            row = (pid - programs_a) * ROWS + r
            b_row_ptr = b_ptr
            if B_BLOCKS:
                b_row_ptr = b_ptr + (row // b_block_rows) * (b_block_stride - b_block_rows * H)
            rms_norm_row(
                b_row_ptr,
                b_row_ptr,
                wb_ptr,
                yb_ptr,
                yb_ptr,
                row,
                RB,
                H,
                eps,
                False,
                HAS_W,
                FINISH,
                BLOCK_H,
            )


def rms_norm_rows_per_program(block: int) -> int:
    """Rows per RMSNorm program: 1 for rows of >= 2048 columns, more for short rows (up to 16,
    so that a program holds ~2048 elements: `configs.LAUNCH`'s "rms_norm" row)."""
    lc = pick_launch("any", "rms_norm")
    return max(1, min(lc["max_rows"], lc["row_elements"] // block))


def rms_norm_launch(hdim: int) -> tuple[int, int, int]:
    """(BLOCK_H, rows per program, warps) of the RMSNorm kernels for rows of `hdim` columns:
    one value per row length, so every kernel that runs `rms_norm_row` with it (the norm, and
    the norm fused with its GEMM operand's quantize) reduces a row in the same order."""
    lc = pick_launch("any", "rms_norm")
    block = triton.next_power_of_2(hdim)
    warps = min(max(block // lc["columns_per_warp"], 1), lc["max_warps"])
    return block, rms_norm_rows_per_program(block), warps


def rms_norm(x, weight, residual, eps: float):
    """(y, h = x + residual, or x). Without a residual, x's rows may lie in blocks
    (`runtime.row_blocks`: a fused q/k/v GEMM's q or k), read in place: no copy."""
    check_kernel_device(x, "x")
    hdim = x.shape[-1]
    num_rows = x.numel() // hdim if hdim else 0
    blocks = row_blocks(x) if residual is None else None
    x2 = x if blocks is not None else x.reshape(-1, hdim).contiguous()
    interp = interpreting()
    if interp and residual is not None:  # the kernel's bf16 store would truncate here
        x2, residual = (x2 + residual.reshape(-1, hdim)).contiguous(), None
    h = torch.empty_like(x2) if residual is not None else x2
    r2 = residual.reshape(-1, hdim).contiguous() if residual is not None else x2
    y = torch.empty((num_rows, hdim), dtype=torch.float32 if interp else x.dtype, device=x.device)
    block, rows, warps = rms_norm_launch(hdim)
    _rms_norm_kernel[(triton.cdiv(num_rows, rows),)](
        x2,
        r2,
        weight if weight is not None else x2,
        y,
        h,
        num_rows,
        hdim,
        eps,
        HAS_RES=residual is not None,
        HAS_W=weight is not None,
        FINISH=not interp,
        BLOCK_H=block,
        ROWS=rows,
        x_block_rows=blocks[0] if blocks else 1,
        x_block_stride=blocks[1] if blocks else 0,
        X_BLOCKS=blocks is not None,
        num_warps=warps,
    )
    if interp:
        y = y.to(x.dtype)
        if weight is not None:
            y = weight * y
    return y.reshape(x.shape), h.reshape(x.shape)


def rms_norm_pair(a, a_weight, b, b_weight, eps: float):
    """(rms_norm(a, a_weight), rms_norm(b, b_weight)) in one launch: rows of the same length H
    (an attention's q and k norms), each row bitwise as `rms_norm` computes it."""
    check_kernel_device(a, "a")
    check_kernel_device(b, "b")
    hdim = a.shape[-1]
    # rows in blocks (`runtime.row_blocks`: a fused q/k/v GEMM's q or k) are read in place
    blocks_a, blocks_b = row_blocks(a), row_blocks(b)
    a2 = a if blocks_a is not None else a.reshape(-1, hdim).contiguous()
    b2 = b if blocks_b is not None else b.reshape(-1, hdim).contiguous()
    rows_a, rows_b = a.numel() // hdim if hdim else 0, b.numel() // hdim if hdim else 0
    interp = interpreting()
    dtype = torch.float32 if interp else a.dtype
    ya = torch.empty((rows_a, hdim), dtype=dtype, device=a.device)
    yb = torch.empty((rows_b, hdim), dtype=dtype, device=b.device)
    block, rows, warps = rms_norm_launch(hdim)
    grid = (triton.cdiv(rows_a, rows) + triton.cdiv(rows_b, rows),)
    if grid[0]:
        _rms_norm_pair_kernel[grid](
            a2,
            a_weight if a_weight is not None else a2,
            ya,
            b2,
            b_weight if b_weight is not None else b2,
            yb,
            rows_a,
            rows_b,
            hdim,
            eps,
            HAS_W=a_weight is not None,
            FINISH=not interp,
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
    if interp:  # the final roundings in torch, as `rms_norm` does here
        ya, yb = ya.to(a.dtype), yb.to(b.dtype)
        if a_weight is not None:
            ya, yb = a_weight * ya, b_weight * yb
    return ya.reshape(a.shape), yb.reshape(b.shape)
