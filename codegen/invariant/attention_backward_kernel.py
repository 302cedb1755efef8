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
- `attention_dq_kernel._dq_kernel`: one program per row block walks the key blocks in order
  from 0 (dQ), and stores delta for the second launch.
- `attention_dkdv_kernel._dkdv_kernel`: one program per key block walks the row blocks in order
  (dK, dV), from the first row that can see the block when causal.
Deterministic: no atomics, every sum in a fixed order, one pinned config. Not batch-invariant
(the backward needs determinism only; `invariant/reference.py` is the reference). Precision: on CUDA the
dot operands are bf16 (q, k, v, dO are bf16 already; P and dS are rounded to bf16 for their
dots, as stock FlashAttention does), accumulation FP32; in the interpreter every dot is FP32.
Replaces FP32 cuBLAS matmuls over materialized [B, Hq, Tq, Tk] tensors
(`benchmarks/results/2026-12-03_learner.md`).
"""

from __future__ import annotations

import torch
import triton.language as tl

from ..runtime import check_kernel_device, interpreting
from . import reference as cpu
from .attention_dkdv_kernel import launch_dkdv
from .attention_dq_kernel import launch_dq
from .attention_kernel import positions_arg
from .attention_masks import mask_args
from .group_sum_kernel import KERNEL_DTYPES, group_sum


def attention_backward(
    grad_out,
    q,
    k,
    v,
    out,
    lse,
    q_start_B,
    kv_len_B,
    mask,
    causal,
    scale,
    kv_grad_dtype=None,
    prepared=None,
):
    """(dq, dk, dv), contiguous, dq in q's dtype, dk and dv of k's shape in kv_grad_dtype
    (default k's dtype); the arguments of `reference.attention_backward`. Key slots at or past
    kv_len get zero gradients. prepared: the mask's (words, intervals, flag) from
    `invariant_attention_mask_args` (made once per graph), else None: `attention_masks.mask_args`
    prepares them here."""
    check_kernel_device(q, "q")
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    if d & (d - 1) or d < 16:
        raise ValueError(
            f"the Triton attention backward needs a power-of-two head dim >= 16, got {d}"
        )
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
        mask_arg, (smb, smh), iv, iv_ok = mask_args(mask, b, hq, tq, tk, prepared)
        sm = (smb, smh, mask_arg.shape[1])
    else:
        sm, mask_arg, iv, iv_ok = (0, 0, 0), q, lse, lse
    qs, kl = positions_arg(q_start_B, "q_start"), positions_arg(kv_len_B, "kv_len")
    dot = tl.float32 if interp else tl.bfloat16
    # the (batch, head, token) strides of q, k and v, the mask rows, dO, O, dq, then dk and dv
    strides = (*q.stride()[:3], *k.stride()[:3], *sm, *do.stride()[:3], *o.stride()[:3])
    strides += (*dq.stride()[:3], *dk.stride()[:3])
    # one stride tuple for both launches: dQ's reads no dk strides, dK/dV's no O or dq strides
    flags = {"CAUSAL": causal, "HAS_MASK": mask is not None, "DOT": dot, "D": d}
    args = (qs, kl, mask_arg, iv, iv_ok, *strides, tq, 1, g, scale)  # the kernels' shared tail
    if b and tq:
        launch_dq(q, k, v, o, do, lse, delta, dq, args, flags)
    if b and tk:
        if not tq:  # no query sees any key
            dk.zero_()
            dv.zero_()
        else:
            launch_dkdv(q, k, v, do, lse, delta, dk, dv, args, flags)
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
