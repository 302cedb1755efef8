"""The dK/dV launch of the invariant attention's backward (`attention_backward_kernel.py` has the
math and the launcher of both launches): one program per (key block, sequence, query head)
walks the row blocks in order, from the first row that can see the block when causal (an
interval mask: only the rows whose interval meets the block, `attention_masks.mask_row_range`).

Shape legend: B sequences, Hq / Hkv heads, G = Hq / Hkv, Tq queries, Tk key slots, D head dim.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import configs as cfgs
from ..runtime import arch_of
from .attention_masks import mask_row_range, visible


@triton.jit
def _dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    qs_ptr,
    kl_ptr,
    m_ptr,
    iv_ptr,
    ivf_ptr,
    sqb,
    sqh,
    sqt,
    skb,
    skh,
    skt,
    smb,
    smh,
    smt,
    sdb,
    sdh,
    sdt,
    sob,
    soh,
    sot,
    sgb,
    sgh,
    sgt,
    sekb,
    sekh,
    sekt,
    Tq,
    G,
    KV_REP,
    scale,
    Tk,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)  # int32 index: a key block inside one sequence
    b = tl.program_id(1)  # int32 index: the sequence; its bases below are int64 (b64)
    hp = tl.program_id(2)  # int32 index: the program's head: dK, dV of its G query heads
    b64 = b.to(tl.int64)
    q_ptr += b64 * sqb
    do_ptr += b64 * sdb
    k_ptr += b64 * skb
    v_ptr += b64 * skb
    dk_ptr += b64 * sekb
    dv_ptr += b64 * sekb
    lse_ptr += b64 * G * tl.num_programs(2) * Tq
    delta_ptr += b64 * G * tl.num_programs(2) * Tq
    kvh = hp // KV_REP  # the key / value head it reads
    j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    kv_len = tl.load(kl_ptr + b).to(tl.int32)
    q_start = tl.load(qs_ptr + b).to(tl.int32)
    key_live = j < kv_len
    kv_off = kvh * skh + j[:, None] * skt + d[None, :]
    k = tl.load(k_ptr + kv_off, mask=key_live[:, None], other=0.0)
    v = tl.load(v_ptr + kv_off, mask=key_live[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    num_rows = Tq * G
    lo = pid_n * 0
    if CAUSAL:  # queries before the block's first key see none of it
        lo = tl.maximum(pid_n * BLOCK_N - q_start, 0) * G // BLOCK_M * BLOCK_M
    lo = tl.where(pid_n * BLOCK_N >= kv_len, num_rows, lo)  # dead key slots only: zeros
    hi = num_rows
    iv_ok = False
    if HAS_MASK:  # row blocks that see none of these keys add exact zeros to dk, dv: skipped
        iv_ok = tl.load(ivf_ptr) != 0
        if iv_ok:
            lo, hi = mask_row_range(
                lo,
                num_rows,
                pid_n * BLOCK_N,
                pid_n * BLOCK_N + BLOCK_N,
                b,
                hp,
                G,
                smb,
                smh,
                iv_ptr,
                Tq,
                BLOCK_M,
            )
    for r0 in range(lo, hi, BLOCK_M):  # row blocks in order
        rows = r0 + tl.arange(0, BLOCK_M)
        qi = rows // G
        hq = hp * G + rows % G
        row_live = qi < Tq
        row_off = hq[:, None] * sqh + qi[:, None] * sqt + d[None, :]
        do_off = hq[:, None] * sdh + qi[:, None] * sdt + d[None, :]
        q = tl.load(q_ptr + row_off, mask=row_live[:, None], other=0.0)
        do = tl.load(do_ptr + do_off, mask=row_live[:, None], other=0.0)
        stat = hq * Tq + qi
        lse = tl.load(lse_ptr + stat, mask=row_live, other=0.0)
        lse = tl.where(lse == float("-inf"), 0.0, lse)
        delta = tl.load(delta_ptr + stat, mask=row_live, other=0.0)
        pos = q_start + qi
        s = tl.dot(q.to(DOT), tl.trans(k).to(DOT), input_precision="ieee") * scale
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
        p = tl.where(vis, tl.exp(s - lse[:, None]), 0.0)
        dv = tl.dot(tl.trans(p).to(DOT), do.to(DOT), dv, input_precision="ieee")
        dp = tl.dot(do.to(DOT), tl.trans(v).to(DOT), input_precision="ieee")
        ds = p * (dp - delta[:, None]) * scale
        dk = tl.dot(tl.trans(ds).to(DOT), q.to(DOT), dk, input_precision="ieee")
    slot = (j < Tk)[:, None]  # slots at or past kv_len store their zeros
    dkv_off = hp * sekh + j[:, None] * sekt + d[None, :]  # dk, dv: contiguous
    tl.store(dk_ptr + dkv_off, dk.to(dk_ptr.dtype.element_ty), mask=slot)
    tl.store(dv_ptr + dkv_off, dv.to(dv_ptr.dtype.element_ty), mask=slot)


def launch_dkdv(q, k, v, do, lse, delta, dk, dv, args, flags) -> None:
    """`_dkdv_kernel` over (key blocks, sequences, query heads) at the pinned config: `args` and
    `flags` as `attention_dq_kernel.launch_dq` takes them (dK, dV per query head: [B, Hq, Tk, D])."""
    b, hq, tk = dk.shape[0], dk.shape[1], k.shape[2]
    cfg = cfgs.pick(arch_of(q.device), "any", "invariant_attention_dkdv", 0)
    _dkdv_kernel[(triton.cdiv(tk, cfg.block_n), b, hq)](
        q,
        k,
        v,
        do,
        lse,
        delta,
        dk,
        dv,
        *args,
        tk,
        **flags,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        **cfg.launch_kwargs(),
    )
