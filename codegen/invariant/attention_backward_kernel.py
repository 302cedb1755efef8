"""The backward of the invariant attention as two Triton launches (CUDA; interpreter in tests).

Shape legend: B sequences, Hq / Hkv heads, G = Hq / Hkv, Tq queries, Tk key slots, D head dim.
Grouped-query attention: the launches run per QUERY head (grid axis 2 = Hq, rows = that head's
queries), each reading its KV head h // G in place (`KV_REP` = G: no copy of k or v), and write
dK, dV per query head; `reference.kv_group_sum` (on CUDA `group_sum_kernel`, one pass) then sums
each group in order r = 0..G-1 in FP32 and rounds once. The same bits as repeating k, v and
differentiating per head, which the learner did before attention read the KV heads in place.
(The kernels' row layout also takes G > 1, row = query * G + head in the group, as the forward
does; the launcher keeps G = 1 for those bits.)

Math (FlashAttention-2 style, P recomputed from the saved lse, no [Tq, Tk] tensor in memory):
  s = (q k^T) * scale, p = exp(s - lse) on visible keys (0 elsewhere), delta = rowsum(dO * O),
  dV = p^T dO, dP = dO v^T, dS = p * (dP - delta) * scale, dQ = dS k, dK = dS^T q.
- `_dq_kernel`: one program per row block walks the key blocks in order from 0 (dQ), and
  stores delta for the second launch.
- `_dkdv_kernel`: one program per key block walks the row blocks in order (dK, dV), from the
  first row that can see the block when causal.
Deterministic: no atomics, every sum in a fixed order, one pinned config. Not batch-invariant
(the backward needs determinism only; `invariant/reference.py` is the reference). Precision: on CUDA the
dot operands are bf16 (q, k, v, dO are bf16 already; P and dS are rounded to bf16 for their
dots, as stock FlashAttention does), accumulation FP32; in the interpreter every dot is FP32.
Replaces FP32 cuBLAS matmuls over materialized [B, Hq, Tq, Tk] tensors
(`benchmarks/results/2026-12-03_learner.md`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import configs as cfgs
from ..runtime import arch_of, check_kernel_device, interpreting
from . import reference as cpu
from .attention_kernel import mask_args, mask_key_end, positions_arg, visible
from .group_sum_kernel import KERNEL_DTYPES, group_sum


@triton.jit
def _dq_kernel(q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, qs_ptr, kl_ptr,
               m_ptr, iv_ptr, ivf_ptr, sqb, sqh, sqt, skb, skh, skt, smb, smh, smt, sdb, sdh, sdt,
               sob, soh, sot, sgb, sgh, sgt, sekb, sekh, sekt, Tq, G, KV_REP, scale,
               CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr, D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
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
        vis = visible(j, key_live, row_live, pos, qi, hq, b, m_ptr, smb, smh, smt, iv_ptr,
                      iv_ok, CAUSAL, HAS_MASK)  # fmt: skip
        p = tl.where(vis, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do.to(DOT), tl.trans(v).to(DOT), input_precision="ieee")
        ds = p * (dp - delta[:, None]) * scale
        dq = tl.dot(ds.to(DOT), k.to(DOT), dq, input_precision="ieee")
    dq_off = hq[:, None] * sgh + qi[:, None] * sgt + d[None, :]
    tl.store(dq_ptr + dq_off, dq.to(dq_ptr.dtype.element_ty), mask=row_live[:, None])


@triton.jit
def _mask_row_range(lo, num_rows, j0, j1, b, hp, G, smb, smh, iv_ptr, Tq,
                    BLOCK_M: tl.constexpr):  # fmt: skip
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


@triton.jit
def _dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, qs_ptr,
                 kl_ptr, m_ptr, iv_ptr, ivf_ptr, sqb, sqh, sqt, skb, skh, skt, smb, smh, smt,
                 sdb, sdh, sdt, sob, soh, sot, sgb, sgh, sgt, sekb, sekh, sekt, Tq, G, KV_REP,
                 scale, Tk, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
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
            lo, hi = _mask_row_range(lo, num_rows, pid_n * BLOCK_N, pid_n * BLOCK_N + BLOCK_N, b,
                                     hp, G, smb, smh, iv_ptr, Tq, BLOCK_M)  # fmt: skip
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
        vis = visible(j, key_live, row_live, pos, qi, hq, b, m_ptr, smb, smh, smt, iv_ptr,
                      iv_ok, CAUSAL, HAS_MASK)  # fmt: skip
        p = tl.where(vis, tl.exp(s - lse[:, None]), 0.0)
        dv = tl.dot(tl.trans(p).to(DOT), do.to(DOT), dv, input_precision="ieee")
        dp = tl.dot(do.to(DOT), tl.trans(v).to(DOT), input_precision="ieee")
        ds = p * (dp - delta[:, None]) * scale
        dk = tl.dot(tl.trans(ds).to(DOT), q.to(DOT), dk, input_precision="ieee")
    slot = (j < Tk)[:, None]  # slots at or past kv_len store their zeros
    dkv_off = hp * sekh + j[:, None] * sekt + d[None, :]  # dk, dv: contiguous
    tl.store(dk_ptr + dkv_off, dk.to(dk_ptr.dtype.element_ty), mask=slot)
    tl.store(dv_ptr + dkv_off, dv.to(dv_ptr.dtype.element_ty), mask=slot)


def attention_backward(
    grad_out, q, k, v, out, lse, q_start_B, kv_len_B, mask, causal, scale, kv_grad_dtype=None
):
    """(dq, dk, dv), contiguous, dq in q's dtype, dk and dv of k's shape in kv_grad_dtype
    (default k's dtype); the arguments of `reference.attention_backward`. Key slots at or past
    kv_len get zero gradients."""
    check_kernel_device(q, "q")
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    if d & (d - 1) or d < 16:
        raise ValueError(
            f"the Triton attention backward needs a power-of-two head dim >= 16, got {d}"
        )
    arch = arch_of(q.device)
    cfg_dq = cfgs.pick(arch, "any", "invariant_attention_dq", 0)
    cfg_dkdv = cfgs.pick(arch, "any", "invariant_attention_dkdv", 0)
    # q, O, dO and dq are each read or written through their own strides, k and v through one
    # shared set, dk and dv (contiguous) another (q and k, v arrive as transposes of
    # [B, T, H, D] from the projections, dO as autograd's transpose: a copy of q or dO was
    # ~48 us per call at the learner's shapes)
    q = q if q.stride(-1) == 1 else q.contiguous()
    o = out if out.stride(-1) == 1 else out.contiguous()
    do = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    if k.stride() != v.stride() or k.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    interp = interpreting()
    dq = torch.empty(q.shape, dtype=torch.float32 if interp else q.dtype, device=q.device)
    # dK, dV per query head (summed per group below)
    dk = torch.empty((b, hq, tk, d), dtype=torch.float32 if interp else k.dtype, device=q.device)
    dv = torch.empty_like(dk)
    lse = lse.contiguous()
    delta = torch.empty_like(lse)
    if mask is not None:
        mask_arg, (smb, smh), iv, iv_ok = mask_args(mask, b, hq, tq, tk)
        sm = (smb, smh, mask_arg.shape[1])
    else:
        sm, mask_arg, iv, iv_ok = (0, 0, 0), q, lse, lse
    qs, kl = positions_arg(q_start_B, "q_start"), positions_arg(kv_len_B, "kv_len")
    dot = tl.float32 if interp else tl.bfloat16
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), *sm,
               do.stride(0), do.stride(1), do.stride(2), o.stride(0), o.stride(1), o.stride(2),
               dq.stride(0), dq.stride(1), dq.stride(2), dk.stride(0), dk.stride(1), dk.stride(2))  # fmt: skip
    # one stride tuple for both launches: dQ's reads no dk strides, dK/dV's no O or dq strides
    flags = {"CAUSAL": causal, "HAS_MASK": mask is not None, "DOT": dot, "D": d}
    if b and tq:
        _dq_kernel[(triton.cdiv(tq, cfg_dq.block_m), b, hq)](
            q, k, v, o, do, lse, delta, dq, qs, kl, mask_arg, iv, iv_ok, *strides, tq, 1, g,
            scale, **flags,
            BLOCK_M=cfg_dq.block_m, BLOCK_N=cfg_dq.block_n, **cfg_dq.launch_kwargs(),
        )  # fmt: skip
    if b and tk:
        if not tq:  # no query sees any key
            dk.zero_()
            dv.zero_()
        else:
            _dkdv_kernel[(triton.cdiv(tk, cfg_dkdv.block_n), b, hq)](
                q, k, v, do, lse, delta, dk, dv, qs, kl, mask_arg, iv, iv_ok, *strides, tq, 1, g,
                scale, tk,
                **flags, BLOCK_M=cfg_dkdv.block_m, BLOCK_N=cfg_dkdv.block_n,
                **cfg_dkdv.launch_kwargs(),
            )  # fmt: skip
    kv_dtype = kv_grad_dtype or k.dtype
    dk_h, dv_h = dk.to(k.dtype), dv.to(v.dtype)  # per query head, rounded to k's dtype
    return dq.to(q.dtype), kv_group_sum(dk_h, g, kv_dtype), kv_group_sum(dv_h, g, kv_dtype)


def kv_group_sum(grad_BHqTD: torch.Tensor, g: int, out_dtype: torch.dtype) -> torch.Tensor:
    """`reference.kv_group_sum` (the ordered group sum of per-query-head gradients): on CUDA
    one pass of `group_sum_kernel` (the same roundings) for FP32 / BF16, else the torch ops."""
    b, hn, t, d = grad_BHqTD.shape
    kernel = grad_BHqTD.dtype in KERNEL_DTYPES and out_dtype in KERNEL_DTYPES
    if g == 1 or not grad_BHqTD.is_cuda or not kernel:
        return cpu.kv_group_sum(grad_BHqTD, g, out_dtype)
    parts = grad_BHqTD.reshape(b * (hn // g), g, t * d)
    return group_sum(parts, round_each=False, out_dtype=out_dtype).reshape(b, hn // g, t, d)
