"""The attention kernels' masks: which keys a row sees (`visible`), what the kernels take for a
mask tensor (`mask_args`: bit words, each row's interval, one flag, made on the device by
`_mask_args_kernel` in `prepare_mask`: once per graph by the op
`fp4_compile::invariant_attention_mask_args`, else inside the attention launchers), and the
bounds an interval mask gives a program's loop (`mask_key_end`: the forward's and dQ's last key
block; `mask_row_range`: dK/dV's row blocks). Skipped blocks hold no visible key for the
program's rows: skipping them changes no bit.

Shape legend: B sequences, Hq heads, Tq queries, Tk key slots; a mask row is one (sequence,
head, query), broadcast dims stride 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch
from ..runtime import arch_of


@triton.jit
def visible(
    j,
    key_live,
    row_live,
    pos,
    qi,
    hq,
    b,
    m_ptr,
    smb,
    smh,
    smt,
    iv_ptr,
    iv_ok,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    """[rows, keys] booleans: key j is live, the row is live, causal (j <= the row's position)
    and the mask (if any: `mask_args`); shared by the forward and the backward kernels.
    Mask row of (b, head hq, query qi): b * smb + hq * smh + qi (broadcast dims 0), its bits
    at row * smt (smt = the int32 words of a mask row), its [lo, hi) at iv_ptr + 2 row. iv_ok:
    every row's visible keys are that one interval (what causal and padding masks are): then the
    two bounds decide, as cheap as the causal test; else the bits are read."""
    vis = key_live[None, :] & row_live[:, None]
    if CAUSAL:
        vis = vis & (j[None, :] <= pos[:, None])
    if HAS_MASK:
        row = b * smb + hq * smh + qi
        if iv_ok:
            lo = tl.load(iv_ptr + 2 * row, mask=row_live, other=0)
            hi = tl.load(iv_ptr + 2 * row + 1, mask=row_live, other=0)
            vis = vis & (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
        else:
            # bit-packed: one int32 word per row and 32 keys, a [rows] load per word of the
            # block (a [rows, keys] tensor of byte pointers took 64 registers a thread and
            # spilled on sm_90). j: consecutive keys, 32-aligned when longer than 32.
            NW: tl.constexpr = (j.shape[0] + 31) // 32
            word = j // 32
            first = tl.min(word)
            row_off = row.to(tl.int64) * smt
            bits = tl.zeros(vis.shape, tl.int32)
            for i in tl.static_range(NW):
                here = word == first + i
                live = tl.max((here & key_live).to(tl.int32), axis=0)
                w_live = row_live & ((qi * 0 + live) > 0)  # a vector: the interpreter wants one
                w = tl.load(m_ptr + row_off + first + i, mask=w_live, other=0)
                bits = tl.where(here[None, :], (w[:, None] >> (j % 32)[None, :]) & 1, bits)
            vis = vis & (bits != 0)
    return vis


@triton.jit
def _mask_args_kernel(m_ptr, words_ptr, iv_ptr, ok_ptr, Tk, W, BLOCK_W: tl.constexpr):
    """One mask row (bytes, 0 or 1) per program, BLOCK_W words (32 keys each) a step -> its
    bit words, its [lo, hi) and, into ok_ptr[0], 0 when its visible keys are not [lo, hi)."""
    row = tl.program_id(0).to(tl.int64)
    bit = tl.arange(0, 32)
    lo = tl.full((), 0, tl.int32) + Tk
    hi = tl.full((), 0, tl.int32)
    count = tl.full((), 0, tl.int32)
    for w0 in range(0, W, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        key = w[:, None] * 32 + bit[None, :]  # [BLOCK_W, 32]
        m = tl.load(m_ptr + row * Tk + key, mask=(w[:, None] < W) & (key < Tk), other=0) != 0
        words = tl.sum(tl.where(m, 1 << bit[None, :], 0), axis=1)  # disjoint bits: exact
        tl.store(words_ptr + row * W + w, words, mask=w < W)
        lo = tl.minimum(lo, tl.min(tl.where(m, key, Tk)))
        hi = tl.maximum(hi, tl.max(tl.where(m, key + 1, 0)))
        count += tl.sum(m.to(tl.int32))
    tl.store(iv_ptr + row * 2, lo)
    tl.store(iv_ptr + row * 2 + 1, hi)
    tl.atomic_min(ok_ptr, (count == tl.maximum(hi - lo, 0)).to(tl.int32))  # min: order-free


def mask_rows(mask: torch.Tensor) -> tuple[int, int]:
    """(mb, mh): the batch and head extents of a boolean mask broadcastable to [B, H, Tq, Tk]
    (1 on a broadcast dim); its rows are the mb * mh * Tq (sequence, head, query) triples."""
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    return shape[0], shape[1]


def mask_strides(mask: torch.Tensor, tq: int) -> tuple[int, int]:
    """(smb, smh): a mask row's (sequence, head) strides in rows, 0 on broadcast dims."""
    mb, mh = mask_rows(mask)
    return (mh * tq if mb > 1 else 0), (tq if mh > 1 else 0)


def prepare_mask(mask: torch.Tensor, tq: int, tk: int):
    """(int32 words [rows, ceil(tk / 32)], bit i of word w = key 32 w + i; int32 [rows, 2] each
    row's [lo, hi) = [first visible key, last + 1); int32 [1] flag: every row's visible keys
    are exactly its [lo, hi)) of a boolean mask (True = attend) broadcastable to
    [B, H, tq, tk], rows as `mask_rows`. One read of the mask on the device
    (`_mask_args_kernel`), no host sync (CUDA-graph safe); `reference.attention_mask_args` is
    the same on the CPU. What `fp4_compile::invariant_attention_mask_args` launches."""
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).to(torch.bool)
    m = m.expand(m.shape[0], m.shape[1], tq, tk).contiguous()
    rows, words = m.shape[0] * m.shape[1] * tq, -(-tk // 32)
    packed = torch.empty((rows, words), dtype=torch.int32, device=m.device)
    iv = torch.empty((rows, 2), dtype=torch.int32, device=m.device)
    iv_ok = torch.ones(1, dtype=torch.int32, device=m.device)
    if rows:
        block_w = pick_launch(arch_of(m.device), "attention_mask_args")["block_w"]
        _mask_args_kernel[(rows,)](
            m.view(torch.uint8), packed, iv, iv_ok, tk, words, BLOCK_W=block_w
        )
    return packed, iv, iv_ok


def mask_args(mask: torch.Tensor, b: int, h: int, tq: int, tk: int, prepared=None):
    """What the kernels take for a boolean mask (True = attend) broadcastable to [b, h, tq, tk]:
    (words, row strides (smb, smh) in rows, intervals, flag), the tensors of `prepare_mask`, or
    `prepared` (the same three, made once per graph by the op
    `fp4_compile::invariant_attention_mask_args`, which every layer's attention reads) checked
    against the mask's rows."""
    if prepared is None:
        packed, iv, iv_ok = prepare_mask(mask, tq, tk)
    else:
        packed, iv, iv_ok = prepared
        mb, mh = mask_rows(mask)
        want = ((mb * mh * tq, -(-tk // 32)), (mb * mh * tq, 2), (1,))
        got = tuple(tuple(t.shape) for t in prepared)
        if got != want or any(t.dtype != torch.int32 for t in prepared):
            raise ValueError(
                f"prepared mask arguments of shapes {got} (dtypes "
                f"{[t.dtype for t in prepared]}) do not fit mask {tuple(mask.shape)} at "
                f"tq={tq}, tk={tk}: want int32 {want}"
            )
    return packed, mask_strides(mask, tq), iv, iv_ok


@triton.jit
def mask_key_end(hi, row_live, qi, hq, b, smb, smh, iv_ptr, iv_ok):
    """hi lowered to 1 + the last key a live row of the block sees through an interval mask
    (iv_ok; else hi). Key blocks past it hold no visible key for any of these rows, which
    leaves their state untouched bit for bit: skipping them changes no bit. (A causal mask
    handed over as a tensor, what transformers builds under torch.compile, would otherwise
    walk every key block.)"""
    if iv_ok:
        row_hi = tl.load(iv_ptr + 2 * (b * smb + hq * smh + qi) + 1, mask=row_live, other=0)
        hi = tl.minimum(hi, tl.max(row_hi))
    return hi


@triton.jit
def mask_row_range(lo, num_rows, j0, j1, b, hp, G, smb, smh, iv_ptr, Tq, BLOCK_M: tl.constexpr):
    """(first, end): row-block bounds, multiples of BLOCK_M within [lo, num_rows), holding every
    row whose interval [lo_r, hi_r) meets the keys [j0, j1) (first == end when none does)."""
    first = num_rows + lo * 0
    last = lo * 0 - 1
    for r0 in range(lo, num_rows, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        qi = rows // G
        row = b * smb + (hp * G + rows % G) * smh + qi
        live = qi < Tq
        lo_r = tl.load(iv_ptr + 2 * row, mask=live, other=0)
        hi_r = tl.load(iv_ptr + 2 * row + 1, mask=live, other=0)
        seen = live & (lo_r < j1) & (hi_r > j0) & (lo_r < hi_r)
        first = tl.minimum(first, tl.min(tl.where(seen, rows, num_rows)))
        last = tl.maximum(last, tl.max(tl.where(seen, rows, -1)))
    first = tl.minimum(first, num_rows) // BLOCK_M * BLOCK_M
    end = tl.where(last < 0, first, (last // BLOCK_M + 1) * BLOCK_M)
    return first, end
