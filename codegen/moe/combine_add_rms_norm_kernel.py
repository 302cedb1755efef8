"""`fp4_compile::moe_combine_add_rms_norm` on CUDA (the interpreter in tests): the MoE top-k
combine in the prologue of the residual add + RMSNorm that reads it, one launch, bitwise
`moe_combine` then `invariant_add_rms_norm`.

Shape legend: S slots (= T tokens x k), H hidden.

One row (token) at a time, ROWS rows per program, with the launch of `rms_norm_kernel` for rows
of H (`rms_norm_launch`: the same BLOCK_H and warps, so the same sum-of-squares order): the
token's combine by `combine_kernel.combine_tokens` (the combine kernel's own code: slot values
and slot-order sums with their BF16 roundings), cast to the output dtype as that kernel's store
casts it, then `rms_norm_kernel.rms_norm_values` (the norm kernel's code after its load: the
residual add rounded once, h stored, the norm). BF16 only (the pass fuses BF16 graphs). Compiled
as the norm kernel is (FMA contraction allowed: its sum of squares); the combine's products and
sums cannot contract there, each is rounded with integer ops before the next operation.
Interpreter: its fp32 -> bf16 casts truncate, so there the add is rounded with integer ops
(`round_bf16_keep_nan`, the same value) and y is finished in torch, as `rms_norm` does.

The parts form (`moe_combine_add_rms_norm_amax`, the strict recipe's decode: the next q/k/v
decode GEMM quantizes y in its prologue, `nvfp4/norm_parts.py`) then runs the second step of
`nvfp4.rms_norm_quantize_kernel.rms_norm_amax` in the same program (a barrier, each row's
max |y| read back: `row_abs_max_part`); the interpreter finishes y in the kernel there
(its two roundings with integer ops) so that the maxima read the final values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..invariant.rms_norm_kernel import rms_norm_launch, rms_norm_values
from ..nvfp4.rms_norm_quantize_kernel import row_abs_max_part
from ..runtime import check_kernel_device, interpreting
from ..triton_helpers import round_bf16_keep_nan
from .combine_kernel import combine_tokens


@triton.jit
def _combine_add_norm_row(
    x_ptr,
    w_ptr,
    idx_ptr,
    r_ptr,
    nw_ptr,
    y_ptr,
    h_ptr,
    row,
    S,
    T,
    H,
    eps,
    K_TOP: tl.constexpr,
    HAS_W: tl.constexpr,
    INTERP: tl.constexpr,
    FINISH_Y: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_H)
    live = (cols < H) & ((cols * 0 + row) < T)
    t64 = row + tl.arange(0, 1).to(tl.int64)  # the token as a block of one
    acc = combine_tokens(
        x_ptr, w_ptr, idx_ptr, x_ptr, t64, S, H, cols, t64 < T, cols < H, K_TOP, True, False
    )
    # moe_combine's output, cast as its kernel's store casts (exact: acc is on BF16's grid)
    c = tl.reshape(acc, (BLOCK_H,)).to(r_ptr.dtype.element_ty)
    if INTERP:
        r = tl.load(r_ptr + row * H + cols, mask=live, other=0.0).to(tl.float32)
        h = round_bf16_keep_nan(c.to(tl.float32) + r)
        tl.store(h_ptr + row * H + cols, h, mask=live)
        rms_norm_values(h, r_ptr, nw_ptr, y_ptr, h_ptr, row, H, eps, cols, live, False, HAS_W, False)  # fmt: skip
        if FINISH_Y:  # the norm's two roundings to BF16 (its FINISH), with integer ops here
            y = round_bf16_keep_nan(tl.load(y_ptr + row * H + cols, mask=live, other=0.0))
            if HAS_W:
                nw = tl.load(nw_ptr + cols, mask=live, other=0.0).to(tl.float32)
                y = round_bf16_keep_nan(y * nw)
            tl.store(y_ptr + row * H + cols, y, mask=live)
    else:
        rms_norm_values(c, r_ptr, nw_ptr, y_ptr, h_ptr, row, H, eps, cols, live, True, HAS_W, True)  # fmt: skip


@triton.jit
def _combine_add_rms_norm_kernel(
    x_ptr,
    w_ptr,
    idx_ptr,
    r_ptr,
    nw_ptr,
    y_ptr,
    h_ptr,
    part_ptr,
    S,
    T,
    H,
    eps,
    K_TOP: tl.constexpr,
    HAS_W: tl.constexpr,
    INTERP: tl.constexpr,
    PARTS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,
):
    for i in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + i
        _combine_add_norm_row(
            x_ptr, w_ptr, idx_ptr, r_ptr, nw_ptr, y_ptr, h_ptr, row, S, T, H, eps,
            K_TOP, HAS_W, INTERP, PARTS, BLOCK_H,
        )  # fmt: skip
    if PARTS:  # `rms_norm_amax`'s second step: each row's max |y|, read back
        tl.debug_barrier()  # this program's rows of y, stored by all its threads, are read back
        for i in tl.static_range(ROWS):
            row = tl.program_id(0).to(tl.int64) * ROWS + i
            row_abs_max_part(y_ptr, part_ptr, row, T, H, BLOCK_H)


def moe_combine_add_rms_norm_triton(residual, x, w, idx, k: int, weight, eps: float):
    """(y, h): h = residual + moe_combine(x, w, idx, k) (residual's shape), y = its RMSNorm."""
    y, h, _ = _launch(residual, x, w, idx, k, weight, eps, parts=False)
    if interpreting():
        y, h = y.to(residual.dtype), h.to(residual.dtype)
        if weight is not None:
            y = weight * y
    return y.reshape(residual.shape), h.reshape(residual.shape)


def moe_combine_add_rms_norm_amax(residual, x, w, idx, k: int, weight, eps: float):
    """(y, row maxima FP32 [T, 1], h): `moe_combine_add_rms_norm_triton`'s y and h, and each
    row's max |y| (NaN where the row holds one), one launch: `moe_combine` then
    `nvfp4.rms_norm_quantize_kernel.rms_norm_amax`, bit for bit (`row_abs_max_part`, its code)."""
    y, h, parts = _launch(residual, x, w, idx, k, weight, eps, parts=True)
    y, h = y.to(residual.dtype), h.to(residual.dtype)  # exact: on BF16's grid (interpreter)
    return y.reshape(residual.shape), parts, h.reshape(residual.shape)


def _launch(residual, x, w, idx, k: int, weight, eps: float, *, parts: bool):
    check_kernel_device(x, "x")
    s, hdim = x.shape
    t = s // k
    x2, w1, idx1 = x.contiguous(), w.reshape(-1).contiguous(), idx.contiguous()
    r2 = residual.reshape(t, hdim).contiguous()
    interp = interpreting()  # its fp32 -> bf16 casts truncate: store FP32 (exact values)
    out_dtype = torch.float32 if interp else residual.dtype
    y = torch.empty((t, hdim), dtype=out_dtype, device=x.device)
    h = torch.empty((t, hdim), dtype=out_dtype, device=x.device)
    maxima = torch.empty((t, 1), dtype=torch.float32, device=x.device)
    block, rows, warps = rms_norm_launch(hdim)
    if t and hdim:
        _combine_add_rms_norm_kernel[(triton.cdiv(t, rows),)](
            x2,
            w1,
            idx1,
            r2,
            weight if weight is not None else r2,
            y,
            h,
            maxima,
            s,
            t,
            hdim,
            eps,
            K_TOP=k,
            HAS_W=weight is not None,
            INTERP=interp,
            PARTS=parts,
            BLOCK_H=block,
            ROWS=rows,
            num_warps=warps,
        )
    return y, h, maxima
