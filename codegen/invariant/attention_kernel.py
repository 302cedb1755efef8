"""Triton kernel of `fp4_compile::invariant_attention`'s forward, its launcher, and the mask
helpers the backward kernels share (`visible`, `mask_args`, `mask_key_end`, `positions_arg`).

Shape legend: B sequences, Hq / Hkv heads, G = Hq / Hkv, Tq queries, Tk key slots, D head dim.

Invariance: keys walked sequentially in fixed BLOCK_N blocks from key 0 (`configs.PINNED`,
one config for the learner, prefill and decode); rows never interact. Interpreter: operands are
loaded as FP32 and the dot dtype is a constexpr (bf16 on CUDA, fp32 in the interpreter); P is
rounded to bf16 with integer bit operations (`round_bf16`, exact on both paths).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import configs as cfgs
from ..configs import pick_launch
from ..runtime import arch_of, check_kernel_device, interpreting
from ..triton_helpers import dot_dtype, round_bf16


@triton.jit
def visible(j, key_live, row_live, pos, qi, hq, b, m_ptr, smb, smh, smt, iv_ptr, iv_ok,
            CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):  # fmt: skip
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


def mask_args(mask: torch.Tensor, b: int, h: int, tq: int, tk: int):
    """What the kernels take for a boolean mask (True = attend) broadcastable to [b, h, tq, tk]:
    (int32 words [rows, ceil(tk / 32)], bit i of word w = key 32 w + i; row strides (smb, smh)
    in rows, 0 on broadcast dims; int32 [rows, 2] each row's [lo, hi) = [first visible key,
    last + 1); int32 [1] flag: every row's visible keys are exactly its [lo, hi)). One read of
    the mask on the device (`_mask_args_kernel`), no host sync (CUDA-graph safe)."""
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).to(torch.bool)
    m = m.expand(m.shape[0], m.shape[1], tq, tk).contiguous()
    mb, mh = m.shape[0], m.shape[1]
    rows, words = mb * mh * tq, -(-tk // 32)
    packed = torch.empty((rows, words), dtype=torch.int32, device=m.device)
    iv = torch.empty((rows, 2), dtype=torch.int32, device=m.device)
    iv_ok = torch.ones(1, dtype=torch.int32, device=m.device)
    if rows:
        block_w = pick_launch(arch_of(m.device), "attention_mask_args")["block_w"]
        _mask_args_kernel[(rows,)](m.view(torch.uint8), packed, iv, iv_ok, tk, words,
                                   BLOCK_W=block_w)  # fmt: skip
    strides = ((mh * tq if mb > 1 else 0), (tq if mh > 1 else 0))
    return packed, strides, iv, iv_ok


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
def _attend_block(q, k_ptr, v_ptr, kv_base, skt, j, key_live, d, vis, m_i, acc, l_acc, ones,
                  scale, DOT: tl.constexpr):  # fmt: skip
    """One key block of the forward: scores, online softmax, the numerator and the row sum
    on the MMA (see `_attention_kernel`). -> (m_i, acc, l_acc)."""
    k = tl.load(k_ptr + kv_base + j[:, None] * skt + d[None, :], mask=key_live[:, None],
                other=0.0).to(DOT)  # fmt: skip
    v = tl.load(v_ptr + kv_base + j[:, None] * skt + d[None, :], mask=key_live[:, None],
                other=0.0).to(DOT)  # fmt: skip
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    s = tl.where(vis, s, float("-inf"))
    any_vis = tl.max(vis.to(tl.int32), axis=1) > 0
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(any_vis, m_new, 0.0)
    p = tl.where(vis, tl.exp(s - m_safe[:, None]), 0.0)
    # a block with no visible key leaves the row's state untouched, bit for bit: its
    # alpha is 1 and its p all zeros, which the MMAs add exactly
    alpha = tl.where(m_i == float("-inf"), 0.0, tl.exp(m_i - m_safe))
    alpha = tl.where(any_vis, alpha, 1.0)
    p_hi = round_bf16(p)
    p16 = p_hi.to(DOT)
    acc = tl.dot(p16, v, acc * alpha[:, None], input_precision="ieee")
    l_acc = tl.dot(p16, ones, l_acc * alpha[:, None], input_precision="ieee")
    l_acc = tl.dot(round_bf16(p - p_hi).to(DOT), ones, l_acc, input_precision="ieee")
    m_i = tl.where(any_vis, m_new, m_i)
    return m_i, acc, l_acc


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, qs_ptr, kl_ptr, m_ptr, iv_ptr,
                      ivf_ptr, sqb, sqh, sqt, skb, skh, skt, sob, soh, sot, smb, smh, smt,
                      Tq, G, scale, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
                      DOT: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):  # fmt: skip
    # int64 offsets (codegen/runtime.py) only where a tensor can pass 2**31 elements: each
    # sequence's base (a batch-256 x 8k-slot cache layer is 2.1e9); offsets inside one
    # sequence stay int32 (int64 tiles spilled the sm_90 forward: tools/ptx_audit.py)
    pid_m = tl.program_id(0)  # int32 index: a row block inside one sequence
    b = tl.program_id(1)  # int32 index: the sequence; its bases below are int64 (b64)
    kvh = tl.program_id(2)  # int32 index: a KV head inside one sequence
    b64 = b.to(tl.int64)
    q_ptr += b64 * sqb
    k_ptr += b64 * skb
    v_ptr += b64 * skb
    o_ptr += b64 * sob
    lse_ptr += b64 * G * tl.num_programs(2) * Tq
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row = query * G + head-in-group
    qi = rows // G
    hq = kvh * G + rows % G
    row_live = qi < Tq
    d = tl.arange(0, D)
    # operands stay in their storage dtype (bf16 on CUDA): FP32 copies of q, k and v took 255
    # registers and spilled on sm_90; the dots see the same values either way
    q = tl.load(q_ptr + hq[:, None] * sqh + qi[:, None] * sqt + d[None, :],
                mask=row_live[:, None], other=0.0).to(DOT)  # fmt: skip
    kv_len = tl.load(kl_ptr + b).to(tl.int32)  # int32 or int64 on the host: no cast launch
    pos = tl.load(qs_ptr + b).to(tl.int32) + qi
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(hi, tl.max(tl.where(row_live, pos, 0)) + 1)
    iv_ok = False
    if HAS_MASK:
        iv_ok = tl.load(ivf_ptr) != 0
        hi = mask_key_end(hi, row_live, qi, hq, b, smb, smh, iv_ptr, iv_ok)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    # The row sum l runs on the tensor cores like the numerator: the MMA sums each row in an
    # order fixed by the instruction, whatever register layout the compiler picks for this
    # kernel variant (a `tl.sum` tree follows that layout: on the H200 the causal and the masked
    # variant summed in different orders, 1 in ~4096 outputs 1 ulp apart, learner vs rollout;
    # tools/localize_gpu.py). FP32 p enters as bf16 p + bf16(p - bf16 p), so l is the sum
    # of p to ~2^-17, not of its bf16 rounding. All 16 columns of l_acc are equal.
    ones = tl.full((BLOCK_N, 16), 1.0, DOT)
    l_acc = tl.zeros((BLOCK_M, 16), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    kv_base = kvh * skh
    # keys in fixed blocks from position 0, in order. An interval mask (iv_ok) runs its own loop:
    # each row's [lo, hi) loaded once, key blocks before the block rows' first visible key
    # skipped (they leave every row's state untouched, bit for bit, like the blocks past the
    # last), no bit-word path in the loop body. The same block arithmetic, so the same bits.
    # (the generic loop is written twice: `if iv_ok` outside `if HAS_MASK` compiled the interval
    # loop into the maskless variant too on Triton 3.6, with its placeholder pointers)
    if HAS_MASK:
        if iv_ok:
            mrow = b * smb + hq * smh + qi
            lo_r = tl.load(iv_ptr + 2 * mrow, mask=row_live, other=0)
            hi_r = tl.load(iv_ptr + 2 * mrow + 1, mask=row_live, other=0)
            first = tl.min(tl.where(row_live, lo_r, kv_len))
            for n0 in range(first // BLOCK_N * BLOCK_N, hi, BLOCK_N):
                j = n0 + tl.arange(0, BLOCK_N)
                key_live = j < kv_len
                vis = key_live[None, :] & row_live[:, None]
                if CAUSAL:
                    vis = vis & (j[None, :] <= pos[:, None])
                vis = vis & (j[None, :] >= lo_r[:, None]) & (j[None, :] < hi_r[:, None])
                m_i, acc, l_acc = _attend_block(q, k_ptr, v_ptr, kv_base, skt, j, key_live, d,
                                                vis, m_i, acc, l_acc, ones, scale, DOT)  # fmt: skip
        else:
            for n0 in range(0, hi, BLOCK_N):
                j = n0 + tl.arange(0, BLOCK_N)
                key_live = j < kv_len
                vis = visible(j, key_live, row_live, pos, qi, hq, b, m_ptr, smb, smh, smt,
                              iv_ptr, iv_ok, CAUSAL, HAS_MASK)  # fmt: skip
                m_i, acc, l_acc = _attend_block(q, k_ptr, v_ptr, kv_base, skt, j, key_live, d,
                                                vis, m_i, acc, l_acc, ones, scale, DOT)  # fmt: skip
    else:
        for n0 in range(0, hi, BLOCK_N):
            j = n0 + tl.arange(0, BLOCK_N)
            key_live = j < kv_len
            vis = visible(j, key_live, row_live, pos, qi, hq, b, m_ptr, smb, smh, smt, iv_ptr,
                          iv_ok, CAUSAL, HAS_MASK)  # fmt: skip
            m_i, acc, l_acc = _attend_block(q, k_ptr, v_ptr, kv_base, skt, j, key_live, d, vis,
                                            m_i, acc, l_acc, ones, scale, DOT)  # fmt: skip
    l_i = tl.max(l_acc, axis=1)
    seen = l_i > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    tl.store(o_ptr + hq[:, None] * soh + qi[:, None] * sot + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_live[:, None])  # fmt: skip
    tl.store(lse_ptr + hq * Tq + qi, lse, mask=row_live)


def positions_arg(t: torch.Tensor, name: str) -> torch.Tensor:
    """A per-sequence position tensor (q_start, kv_len) as the attention kernels read it: int32
    or int64 [B] as it is (the kernels load it and narrow it to int32), no cast launch."""
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise ValueError(f"{name} must be int32/int64 [B], got {t.dtype} {tuple(t.shape)}")
    return t.contiguous()


def attention(q, k, v, q_start_B, kv_len_B, mask, causal: bool, scale: float):
    """(out, lse) of `reference.attention`. One program per (row block, sequence, KV head): its
    rows are the G query heads of the group (row = query * G + head), so each KV head is read
    in place, once per row block, never copied per query head; its key loop ends at the block
    holding the last key its rows see (kv_len, causal, an interval mask: in decode, the filled
    part of the sequence's cache), from key 0 in fixed BLOCK_N blocks as in the learner."""
    check_kernel_device(q, "q")
    b, hq, tq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    if d & (d - 1) or d < 16:
        raise ValueError(
            f"the Triton attention kernel needs a power-of-two head dim >= 16, got {d}"
        )
    cfg = cfgs.pick(arch_of(q.device), "any", "invariant_attention", 0)
    # q is read through its own strides (it arrives as the transpose of [B, Tq, Hq, D] from
    # the projections: a contiguous copy was ~48 us per call), k and v through one shared set
    q = q if q.stride(-1) == 1 else q.contiguous()
    if k.stride() != v.stride() or k.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    interp = interpreting()
    out = torch.empty(q.shape, dtype=torch.float32 if interp else q.dtype, device=q.device)
    lse = torch.empty((b, hq, tq), dtype=torch.float32, device=q.device)
    if mask is not None:
        mask_arg, (smb, smh), iv, iv_ok = mask_args(mask, b, hq, tq, k.shape[2])
        sm = (smb, smh, mask_arg.shape[1])
    else:
        sm, mask_arg, iv, iv_ok = (0, 0, 0), q, lse, lse
    grid = (triton.cdiv(tq * g, cfg.block_m), b, hkv)
    _attention_kernel[grid](
        q, k, v, out, lse, positions_arg(q_start_B, "q_start"), positions_arg(kv_len_B, "kv_len"),
        mask_arg,
        iv, iv_ok,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        out.stride(0), out.stride(1), out.stride(2), *sm, tq, g, scale,
        CAUSAL=causal, HAS_MASK=mask is not None, DOT=dot_dtype(), D=d,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **cfg.launch_kwargs(),
    )  # fmt: skip
    return out.to(q.dtype), lse
