"""The dQ launch of the invariant attention's backward (`attention_backward_kernel.py` has the
math and the launcher of both launches): one program per (row block, sequence, query head)
walks the key blocks in order from key 0, recomputing P from the saved lse, and stores
delta = rowsum(dO * O) for the dK/dV launch.

Shape legend: B sequences, Hq / Hkv heads, G = Hq / Hkv, Tq queries, Tk key slots, D head dim.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import configs as cfgs
from ..runtime import arch_of
from .attention_masks import mask_key_end, visible


@triton.jit
def _dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
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
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # int64 only in each sequence's bases (as the forward, `attention_kernel.py`)
    pid_m = tl.program_id(0)  # int32 index: a row block inside one sequence
    b = tl.program_id(1)  # int32 index: the sequence; its bases below are int64 (b64)
    hp = tl.program_id(2)  # int32 index: the program's head: rows hold its G query heads
    b64 = b.to(tl.int64)
    q_ptr += b64 * sqb
    do_ptr += b64 * sdb
    o_ptr += b64 * sob
    dq_ptr += b64 * sgb
    k_ptr += b64 * skb
    v_ptr += b64 * skb
    lse_ptr += b64 * G * tl.num_programs(2) * Tq
    delta_ptr += b64 * G * tl.num_programs(2) * Tq
    kvh = hp // KV_REP  # the key / value head it reads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = rows // G
    hq = hp * G + rows % G
    row_live = qi < Tq
    d = tl.arange(0, D)
    row_off = hq[:, None] * sqh + qi[:, None] * sqt + d[None, :]
    do_off = hq[:, None] * sdh + qi[:, None] * sdt + d[None, :]
    o_off = hq[:, None] * soh + qi[:, None] * sot + d[None, :]
    q = tl.load(q_ptr + row_off, mask=row_live[:, None], other=0.0)
    do = tl.load(do_ptr + do_off, mask=row_live[:, None], other=0.0)
    o = tl.load(o_ptr + o_off, mask=row_live[:, None], other=0.0)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)
    stat = hq * Tq + qi
    tl.store(delta_ptr + stat, delta, mask=row_live)
    lse = tl.load(lse_ptr + stat, mask=row_live, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    kv_len = tl.load(kl_ptr + b).to(tl.int32)
    pos = tl.load(qs_ptr + b).to(tl.int32) + qi
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(hi, tl.max(tl.where(row_live, pos, 0)) + 1)
    iv_ok = False
    if HAS_MASK:  # key blocks no row sees add exact zeros to dq: skipped
        iv_ok = tl.load(ivf_ptr) != 0
        hi = mask_key_end(hi, row_live, qi, hq, b, smb, smh, iv_ptr, iv_ok)
    dq = tl.zeros((BLOCK_M, D), tl.float32)
    for n0 in range(0, hi, BLOCK_N):  # key blocks from 0, in order
        j = n0 + tl.arange(0, BLOCK_N)
        key_live = j < kv_len
        kv_off = kvh * skh + j[:, None] * skt + d[None, :]
        k = tl.load(k_ptr + kv_off, mask=key_live[:, None], other=0.0)
        v = tl.load(v_ptr + kv_off, mask=key_live[:, None], other=0.0)
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
        dp = tl.dot(do.to(DOT), tl.trans(v).to(DOT), input_precision="ieee")
        ds = p * (dp - delta[:, None]) * scale
        dq = tl.dot(ds.to(DOT), k.to(DOT), dq, input_precision="ieee")
    dq_off = hq[:, None] * sgh + qi[:, None] * sgt + d[None, :]
    tl.store(dq_ptr + dq_off, dq.to(dq_ptr.dtype.element_ty), mask=row_live[:, None])


def launch_dq(q, k, v, o, do, lse, delta, dq, args, flags) -> None:
    """`_dq_kernel` over (row blocks, sequences, query heads) at the pinned config: `args` the
    positions, mask arguments, strides and sizes both launches take, `flags` their constexprs
    (`attention_backward_kernel.attention_backward` builds both)."""
    b, hq, tq = q.shape[0], q.shape[1], q.shape[2]
    cfg = cfgs.pick(arch_of(q.device), "any", "invariant_attention_dq", 0)
    _dq_kernel[(triton.cdiv(tq, cfg.block_m), b, hq)](
        q,
        k,
        v,
        o,
        do,
        lse,
        delta,
        dq,
        *args,
        **flags,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        **cfg.launch_kwargs(),
    )
