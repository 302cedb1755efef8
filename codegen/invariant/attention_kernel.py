"""Triton kernel of `fp4_compile::invariant_attention`'s forward and its launcher, and
`positions_arg`, which the backward's launcher shares (the mask helpers: `attention_masks.py`).

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
from ..runtime import arch_of, check_kernel_device, interpreting
from ..triton_helpers import dot_dtype
from .attention_blocks import attend_block, key_block_base, out_abs_max
from .attention_masks import mask_args, mask_key_end, visible


@triton.jit
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    qs_ptr,
    kl_ptr,
    m_ptr,
    iv_ptr,
    ivf_ptr,
    bt_ptr,
    sqb,
    sqh,
    sqt,
    skb,
    skh,
    skt,
    sob,
    soh,
    sot,
    smb,
    smh,
    smt,
    sbt,
    spage,
    Tq,
    G,
    scale,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    part_ptr,
    PARTS: tl.constexpr = False,
    PARTS_ROUND: tl.constexpr = False,
):
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
    q = tl.load(
        q_ptr + hq[:, None] * sqh + qi[:, None] * sqt + d[None, :],
        mask=row_live[:, None],
        other=0.0,
    ).to(DOT)
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
                m_i, acc, l_acc = attend_block(
                    q,
                    k_ptr,
                    v_ptr,
                    key_block_base(kv_base, n0, bt_ptr, b64, sbt, spage, skt, PAGED, PAGE),
                    skt,
                    j,
                    key_live,
                    d,
                    vis,
                    m_i,
                    acc,
                    l_acc,
                    ones,
                    scale,
                    DOT,
                )
        else:
            for n0 in range(0, hi, BLOCK_N):
                j = n0 + tl.arange(0, BLOCK_N)
                key_live = j < kv_len
                vis = visible(
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
                    CAUSAL,
                    HAS_MASK,
                )
                m_i, acc, l_acc = attend_block(
                    q,
                    k_ptr,
                    v_ptr,
                    key_block_base(kv_base, n0, bt_ptr, b64, sbt, spage, skt, PAGED, PAGE),
                    skt,
                    j,
                    key_live,
                    d,
                    vis,
                    m_i,
                    acc,
                    l_acc,
                    ones,
                    scale,
                    DOT,
                )
    else:
        for n0 in range(0, hi, BLOCK_N):
            j = n0 + tl.arange(0, BLOCK_N)
            key_live = j < kv_len
            vis = visible(
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
                CAUSAL,
                HAS_MASK,
            )
            m_i, acc, l_acc = attend_block(
                q,
                k_ptr,
                v_ptr,
                key_block_base(kv_base, n0, bt_ptr, b64, sbt, spage, skt, PAGED, PAGE),
                skt,
                j,
                key_live,
                d,
                vis,
                m_i,
                acc,
                l_acc,
                ones,
                scale,
                DOT,
            )
    l_i = tl.max(l_acc, axis=1)
    seen = l_i > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    tl.store(
        o_ptr + hq[:, None] * soh + qi[:, None] * sot + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_live[:, None],
    )
    tl.store(lse_ptr + hq * Tq + qi, lse, mask=row_live)
    if PARTS:  # Tq = 1: row r is head hq of token b, a piece of o_proj's row b: parts[b, hq]
        part = out_abs_max(out, o_ptr.dtype.element_ty, PARTS_ROUND)
        tl.store(part_ptr + b64 * G * tl.num_programs(2) + hq, part, mask=row_live)


def positions_arg(t: torch.Tensor, name: str) -> torch.Tensor:
    """A per-sequence position tensor (q_start, kv_len) as the attention kernels read it: int32
    or int64 [B] as it is (the kernels load it and narrow it to int32), no cast launch."""
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise ValueError(f"{name} must be int32/int64 [B], got {t.dtype} {tuple(t.shape)}")
    return t.contiguous()


def attention(
    q,
    k,
    v,
    q_start_B,
    kv_len_B,
    mask,
    causal: bool,
    scale: float,
    prepared=None,
    block_table=None,
    *,
    row_parts: bool = False,
):
    """(out, lse) of `reference.attention`. One program per (row block, sequence, KV head): its
    rows are the G query heads of the group (row = query * G + head), so each KV head is read
    in place, once per row block, never copied per query head; its key loop ends at the block
    holding the last key its rows see (kv_len, causal, an interval mask: in decode, the filled
    part of the sequence's cache), from key 0 in fixed BLOCK_N blocks as in the learner.
    prepared: the mask's (words, intervals, flag) from `invariant_attention_mask_args` (made
    once per graph), else None: `attention_masks.mask_args` prepares them here.
    block_table: int32/int64 [B, P] for a paged cache: k and v are then page pools
    [num_pages, Hkv, PAGE, D] and sequence b's key j lives in page block_table[b, j // PAGE],
    slot j % PAGE; the kernel reads the pages where they are (no gathered copy), in the same
    BLOCK_N blocks from key 0 (PAGE must be a multiple of BLOCK_N), so the same bits as the
    contiguous [B, Hkv, P * PAGE, D] cache.
    row_parts (decode, Tq = 1, BF16): also each head's max |out| (out as stored, BF16; NaN
    where the head's row holds one), FP32 [B, Hq]: the partial maxima of the rows of
    out.transpose(1, 2).reshape(B, Hq * D) (o_proj's operand) that its decode GEMM's prologue
    folds (`invariant_attention_parts`); returned third."""
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
    if block_table is None:
        tk, page, paged_args = k.shape[2], cfg.block_n, (kv_len_B, 0, 0)
        kv_strides = k.stride()[:3]
    else:
        page = k.shape[2]
        if page % cfg.block_n or block_table.dim() != 2 or block_table.shape[0] != b:
            raise ValueError(
                f"a paged cache needs pages of a multiple of the key block {cfg.block_n} and a "
                f"[B={b}, P] block table, got pages of {page}, table {tuple(block_table.shape)}"
            )
        tk = block_table.shape[1] * page
        paged_args = (block_table, block_table.stride(0), k.stride(0))
        kv_strides = (0, *k.stride()[1:3])  # no per-sequence base: the table places the pages
    if mask is not None:
        mask_arg, (smb, smh), iv, iv_ok = mask_args(mask, b, hq, tq, tk, prepared)
        sm = (smb, smh, mask_arg.shape[1])
    else:
        sm, mask_arg, iv, iv_ok = (0, 0, 0), q, lse, lse
    grid = (triton.cdiv(tq * g, cfg.block_m), b, hkv)
    if row_parts and (tq != 1 or q.dtype != torch.bfloat16):
        raise ValueError(f"row_parts needs a BF16 decode (Tq = 1), got {q.dtype} Tq = {tq}")
    parts = torch.empty((b, hq) if row_parts else (0,), dtype=torch.float32, device=q.device)
    extra = dict(PARTS=True, PARTS_ROUND=interp) if row_parts else {}
    positions = (positions_arg(q_start_B, "q_start"), positions_arg(kv_len_B, "kv_len"))
    # the (batch, head, token) strides of q, of k and v, of out, then the mask rows', then the
    # block table's row and the pool's page strides
    strides = (*q.stride()[:3], *kv_strides, *out.stride()[:3], *sm, *paged_args[1:])
    args = (q, k, v, out, lse, *positions, mask_arg, iv, iv_ok, paged_args[0], *strides)
    flags = {"CAUSAL": causal, "HAS_MASK": mask is not None, "DOT": dot_dtype(), "D": d}
    flags |= {"PAGED": block_table is not None, "PAGE": page}
    _attention_kernel[grid](
        *args,
        tq,
        g,
        scale,
        **flags,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        part_ptr=parts if row_parts else lse,  # unread without row_parts
        **extra,
        **cfg.launch_kwargs(),
    )
    return (out.to(q.dtype), lse, parts) if row_parts else (out.to(q.dtype), lse)
