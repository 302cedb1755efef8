"""Triton kernel of `fp4_compile::invariant_position_mask` (the step's position mask, its
attention kernel arguments and lengths, in one launch), and its launcher.

Shape legend: B sequences, Tq queries, S key slots, rows = B * Tq, W = ceil(S / 32).

One program per mask row (sequence b, query qi), BLOCK_W words (32 keys each) a step: key j is
visible iff (j <= p and j < kv_len) or j == 0, p = positions[b, qi], kv_len = kv_len[b] (the
comparisons of `decode_reference.position_mask`, on the same int64 values); the row's mask
bytes, bit words and [lo, hi) as `attention_masks._mask_args_kernel` makes them from a mask.
The flag is a constant 1: every row sees exactly [0, max(1, min(p + 1, kv_len, S))), one
interval (what `reference.attention_mask_args` computes of this mask; tested for every edge:
p < 0, p >= S, kv_len 0 or > S). Program (b, 0) writes q_start[b] = 0 and kv_keys[b] = S.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import kernel_target


@triton.jit
def _position_mask_kernel(
    pos_ptr,
    kv_ptr,
    mask_ptr,
    words_ptr,
    iv_ptr,
    flag_ptr,
    q_start_ptr,
    kv_keys_ptr,
    Tq,
    S,
    W,
    s_pb,
    s_pt,
    BLOCK_W: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    b = row // Tq
    qi = row % Tq
    p = tl.load(pos_ptr + b * s_pb + qi * s_pt)
    kv = tl.load(kv_ptr + b)
    bit = tl.arange(0, 32)
    lo = tl.full((), 0, tl.int32) + S
    hi = tl.full((), 0, tl.int32)
    for w0 in range(0, W, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        key = w[:, None] * 32 + bit[None, :]  # [BLOCK_W, 32]
        inside = (w[:, None] < W) & (key < S)
        m = (((key.to(tl.int64) <= p) & (key.to(tl.int64) < kv)) | (key == 0)) & inside
        tl.store(mask_ptr + row * S + key, m.to(tl.uint8), mask=inside)
        words = tl.sum(tl.where(m, 1 << bit[None, :], 0), axis=1)  # disjoint bits: exact
        tl.store(words_ptr + row * W + w, words, mask=w < W)
        lo = tl.minimum(lo, tl.min(tl.where(m, key, S)))
        hi = tl.maximum(hi, tl.max(tl.where(m, key + 1, 0)))
    tl.store(iv_ptr + row * 2, lo)
    tl.store(iv_ptr + row * 2 + 1, hi)
    tl.store(flag_ptr, tl.full((), 1, tl.int32), mask=row == 0)
    first = qi == 0
    tl.store(q_start_ptr + b, tl.full((), 0, tl.int64), mask=first)
    tl.store(kv_keys_ptr + b, tl.full((), 0, tl.int64) + S, mask=first)


def position_mask(positions: torch.Tensor, kv_len: torch.Tensor, max_seq_len: int):
    """`decode_reference.position_mask_args` in one launch (arguments checked by the op; kv_len
    contiguous)."""
    target = kernel_target(positions, "positions")
    if not kv_len.is_contiguous():
        raise ValueError("kv_len must be contiguous")
    b, tq = positions.shape
    rows, words, dev = b * tq, -(-max_seq_len // 32), positions.device
    mask = torch.empty((b, 1, tq, max_seq_len), dtype=torch.bool, device=dev)
    packed = torch.empty((rows, words), dtype=torch.int32, device=dev)
    iv = torch.empty((rows, 2), dtype=torch.int32, device=dev)
    flag = torch.empty((1,), dtype=torch.int32, device=dev)
    q_start = torch.empty((b,), dtype=torch.int64, device=dev)
    kv_keys = torch.empty((b,), dtype=torch.int64, device=dev)
    if rows:
        lc = pick_launch(target.arch, "position_mask")
        _position_mask_kernel[(rows,)](
            positions,
            kv_len,
            mask.view(torch.uint8),
            packed,
            iv,
            flag,
            q_start,
            kv_keys,
            tq,
            max_seq_len,
            words,
            positions.stride(0),
            positions.stride(1),
            BLOCK_W=lc["block_w"],
            **warps_kwargs(lc),
            **target.options,
        )
    else:  # no row (Tq = 0): nothing launches; the reference's flag of no row is 1
        flag.fill_(1)
        q_start.zero_()
        kv_keys.fill_(max_seq_len)
    return mask, packed, iv, flag, q_start, kv_keys
