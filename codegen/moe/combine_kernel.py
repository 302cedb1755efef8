"""`fp4_compile::moe_combine`'s forward on CUDA (the interpreter in tests): one Triton pass,
bitwise `combine.moe_combine_reference` (the composition of `row_scale`, `gather_rows`
and `ordered_sum`).

Shape legend: S slots (= T tokens x k), H hidden.

Program (token block, column block): for slot j = 0 .. k-1 of each token, row p = idx[t*k + j]
(negative: + S, as x[idx] wraps), v = x[p] * w[p] in FP32 rounded to the output dtype (the
row-scaled copy's value), the sum started from slot 0's v and every partial sum rounded to the
output dtype (BF16 with integer ops, NaN kept: `group_sum_kernel`); FP32 output: no rounding
beyond the FP32 ops. The four ops it replaces read or wrote [S, H] seven times; this reads x's
slot rows once and writes [T, H]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import arch_of, check_kernel_device, compile_options, interpreting, row_mask_bytes
from ..triton_helpers import round_bf16_keep_nan


@triton.jit
def _slot_value(
    x_ptr,
    w_ptr,
    idx_ptr,
    m_ptr,
    t,
    j,
    S,
    H,
    cols,
    tmask,
    cmask,
    K_TOP,
    BF16: tl.constexpr,
    ROW_MASK: tl.constexpr,
):
    p = tl.load(idx_ptr + t * K_TOP + j, mask=tmask, other=0).to(tl.int64)
    p = tl.where(p < 0, p + S, p)
    wv = tl.load(w_ptr + p, mask=tmask, other=0.0).to(tl.float32)
    m = tmask[:, None] & cmask[None, :]
    if ROW_MASK:  # a masked row of x reads as zeros (x.masked_fill(row_mask, 0) folded in)
        m = m & (tl.load(m_ptr + p, mask=tmask, other=1) == 0)[:, None]
    xv = tl.load(x_ptr + p[:, None] * H + cols[None, :], mask=m, other=0.0).to(tl.float32)
    v = xv * wv[:, None]
    if BF16:
        v = round_bf16_keep_nan(v)
    return v


@triton.jit
def combine_tokens(
    x_ptr,
    w_ptr,
    idx_ptr,
    m_ptr,
    t64,
    S,
    H,
    cols,
    tmask,
    cmask,
    K_TOP: tl.constexpr,
    BF16: tl.constexpr,
    ROW_MASK: tl.constexpr,
):
    """[len(t64), len(cols)] FP32: tokens t64's combine (slot values summed in slot order, each
    partial sum rounded to BF16 where BF16), before the cast to the output dtype. Shared with
    `combine_add_rms_norm_kernel` (the combine in a norm's prologue): the same code, the same bits."""
    # the k slots unrolled (K_TOP a constant): every slot's index, weight and row loads can be
    # in flight at once, not one slot's chain of dependent loads after another (the sums are
    # still added in slot order)
    acc = _slot_value(
        x_ptr, w_ptr, idx_ptr, m_ptr, t64, 0, S, H, cols, tmask, cmask, K_TOP, BF16, ROW_MASK
    )
    for j in tl.static_range(1, K_TOP):
        acc = acc + _slot_value(
            x_ptr, w_ptr, idx_ptr, m_ptr, t64, j, S, H, cols, tmask, cmask, K_TOP, BF16, ROW_MASK
        )
        if BF16:
            acc = round_bf16_keep_nan(acc)
    return acc


@triton.jit
def _moe_combine_kernel(
    x_ptr,
    w_ptr,
    idx_ptr,
    out_ptr,
    m_ptr,
    S,
    T,
    H,
    K_TOP: tl.constexpr,
    BF16: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROW_MASK: tl.constexpr = False,
):
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    tmask = t < T
    cmask = cols < H
    t64 = t.to(tl.int64)
    acc = combine_tokens(
        x_ptr, w_ptr, idx_ptr, m_ptr, t64, S, H, cols, tmask, cmask, K_TOP, BF16, ROW_MASK
    )
    tl.store(
        out_ptr + t64[:, None] * H + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=tmask[:, None] & cmask[None, :],
    )


def moe_combine_triton(x, w, idx, k, out_dtype, row_mask=None):
    check_kernel_device(x, "x")
    s, h = x.shape
    t = s // k
    x2, w1, idx1 = x.contiguous(), w.reshape(-1).contiguous(), idx.contiguous()
    m = row_mask_bytes(row_mask, s)
    interp = interpreting()  # its fp32 -> bf16 casts truncate: store FP32 (exact values)
    out = torch.empty((t, h), dtype=torch.float32 if interp else out_dtype, device=x.device)
    if t and h:
        lc = pick_launch(arch_of(x.device), "moe_combine")
        _moe_combine_kernel[(triton.cdiv(t, lc["block_t"]), triton.cdiv(h, lc["block_h"]))](
            x2,
            w1,
            idx1,
            out,
            m if m is not None else out,
            s,
            t,
            h,
            k,
            BF16=out_dtype == torch.bfloat16,
            BLOCK_T=lc["block_t"],
            BLOCK_H=lc["block_h"],
            ROW_MASK=m is not None,
            **warps_kwargs(lc),
            **compile_options(x.device),
        )
    return out.to(out_dtype)
