"""`fp4_compile::invariant_attention` and its backward op. Validation and documentation live
in `invariant/api.py` (the public API).

Shape legend: B sequences, Hq / Hkv heads, G = Hq / Hkv, Tq queries, Tk keys, D head dim.

- invariant_attention(q, k, v, q_start, kv_len, mask, causal, scale, mask_words=None,
  mask_intervals=None, mask_flag=None, block_table=None) -> (out, lse);
  invariant_attention_backward(...) -> (dq, dk, dv)
- invariant_attention_parts(same arguments) -> (out, lse, parts): decode inference's form,
  parts FP32 [B * Tq, Hq] each head's max |out| (o_proj's partial row maxima; no backward).
The trailing three: `fp4_compile::invariant_attention_mask_args(mask, Tq, Tk)`'s outputs, made
once per graph for every attention of that mask (`passes/targets.py`); given, the CUDA path
reads them instead of preparing the mask in every call (the same tensors: the same bits), and
autograd saves them for the backward. The CPU path reads `mask` (the reference stays the
reference).
Grouped-query attention reads the KV heads in place (query head h reads KV head h // G): no
copy of k or v, in the learner's forward, prefill and decode on the static cache. k and v may
be FP32 where q is BF16 / FP16 (a model held in FP32): they are rounded to q's dtype inside the
op, so the backward's group sum of dK / dV rounds once, to k's own dtype. The backward computes
dK, dV per query head and sums each group in a fixed order (`reference.kv_group_sum`), the bits
of the repeat-then-attend lowering it replaces.
block_table (the rollout's paged KV cache, forward only): k and v are page pools
[num_pages, Hkv, PAGE, D] and block_table [B, P] int names each sequence's pages in order
(`kv_pages.py`); the kernel reads the pages in place, the CPU path gathers them into the
contiguous [B, Hkv, P * PAGE, D] layout first (the same keys: the same bits).
CPU: `invariant/reference.py` (invariant by construction). CUDA: the Triton kernel of
`invariant/attention_kernel.py` (imported lazily); the backward two Triton launches
(`attention_backward_kernel`) and the group sum.
"""

from __future__ import annotations

import torch

from . import reference as cpu
from .kv_pages import gather_pages

_LIB = "fp4_compile"


@torch.library.custom_op(f"{_LIB}::invariant_attention", mutates_args=())
def invariant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_start: torch.Tensor,
    kv_len: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    mask_words: torch.Tensor | None = None,
    mask_intervals: torch.Tensor | None = None,
    mask_flag: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = k.to(q.dtype), v.to(q.dtype)  # FP32 k, v (a model held in FP32): rounded here
    prepared = _prepared(mask, mask_words, mask_intervals, mask_flag)
    if q.is_cuda:
        from . import attention_kernel  # lazy: imports triton

        out, lse = attention_kernel.attention(
            q, k, v, q_start, kv_len, mask, causal, scale, prepared, block_table
        )
    else:
        if block_table is not None:  # the reference reads the contiguous layout
            k, v = gather_pages(k, block_table), gather_pages(v, block_table)
        out, lse = cpu.attention(q, k, v, q_start, kv_len, mask, causal, scale)
    return out.contiguous(), lse.contiguous()  # the fake promises contiguous outputs


@invariant_attention.register_fake
def _(q, k, v, q_start, kv_len, mask, causal, scale, *prepared_and_table):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op(f"{_LIB}::invariant_attention_parts", mutates_args=())
def invariant_attention_parts(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_start: torch.Tensor,
    kv_len: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    mask_words: torch.Tensor | None = None,
    mask_intervals: torch.Tensor | None = None,
    mask_flag: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse) of `invariant_attention` and each head's max |out| per token, FP32
    [B * Tq, Hq] (NaN where the head's row holds one): partial maxima of the rows of
    out.transpose(1, 2).reshape(B * Tq, Hq * D), the attention output projection's operand,
    which its decode GEMM's prologue folds (`nvfp4_linear_with_parts`). Inference only (no
    backward). CUDA: the kernel's epilogue (decode only: Tq = 1, BF16); CPU: the reference's
    out, then the maxima in torch."""
    k, v = k.to(q.dtype), v.to(q.dtype)
    prepared = _prepared(mask, mask_words, mask_intervals, mask_flag)
    if q.is_cuda:
        from . import attention_kernel  # lazy: imports triton

        out, lse, parts = attention_kernel.attention(
            q, k, v, q_start, kv_len, mask, causal, scale, prepared, block_table, row_parts=True
        )
        return out.contiguous(), lse.contiguous(), parts
    out, lse = invariant_attention(q, k, v, q_start, kv_len, mask, causal, scale, *prepared or (None,) * 3, block_table)  # fmt: skip
    heads = out.transpose(1, 2).reshape(-1, q.shape[1], q.shape[3]).to(torch.float32)
    parts = heads.abs().amax(dim=2).masked_fill(heads.isnan().any(dim=2), float("nan"))
    return out, lse, parts


@invariant_attention_parts.register_fake
def _(q, k, v, q_start, kv_len, mask, causal, scale, *prepared_and_table):
    b, hq, tq, _ = q.shape
    parts = q.new_empty((b * tq, hq), dtype=torch.float32)
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32), parts


@torch.library.custom_op(f"{_LIB}::invariant_attention_backward", mutates_args=())
def invariant_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_start: torch.Tensor,
    kv_len: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    mask_words: torch.Tensor | None = None,
    mask_intervals: torch.Tensor | None = None,
    mask_flag: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kv_dtype = k.dtype  # dK, dV: each group's sum rounded once, to k's own dtype
    k, v = k.to(q.dtype), v.to(q.dtype)
    args = (grad_out, q, k, v, out, lse, q_start, kv_len, mask, causal, scale)
    prepared = _prepared(mask, mask_words, mask_intervals, mask_flag)
    if q.is_cuda:
        from .attention_backward_kernel import attention_backward  # lazy: imports triton

        grads = attention_backward(*args, kv_grad_dtype=kv_dtype, prepared=prepared)
    else:
        grads = cpu.attention_backward(*args, kv_grad_dtype=kv_dtype)
    return tuple(g.contiguous() for g in grads)


@invariant_attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, q_start, kv_len, mask, causal, scale, *prepared):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _prepared(mask, words, intervals, flag):
    """The precomputed mask arguments as the launchers take them: a triple, or None (none
    given, or no mask). All three or none."""
    given = [t is not None for t in (words, intervals, flag)]
    if any(given) and not all(given):
        raise ValueError("mask_words, mask_intervals and mask_flag: give all three or none")
    if all(given) and mask is None:
        raise ValueError("mask_words, mask_intervals and mask_flag are given without a mask")
    return (words, intervals, flag) if all(given) else None


def _attn_setup(ctx, inputs, output):
    q, k, v, q_start, kv_len, mask, causal, scale, *prepared = inputs
    prepared = (list(prepared) + [None] * 4)[:4]  # the defaults, where inputs leave them out
    ctx.paged = prepared.pop() is not None  # a rollout's forward: its backward is refused
    out, lse = output
    ctx.mark_non_differentiable(lse)
    if ctx.paged:
        return
    ctx.save_for_backward(q, k, v, out, lse, q_start, kv_len, mask, *prepared)
    ctx.causal, ctx.scale = causal, scale


def _attn_backward(ctx, grad_out, grad_lse):
    if ctx.paged:
        raise ValueError("invariant_attention on a paged cache (block_table) has no backward")
    q, k, v, out, lse, q_start, kv_len, mask, *prepared = ctx.saved_tensors
    dq, dk, dv = invariant_attention_backward(
        grad_out, q, k, v, out, lse, q_start, kv_len, mask, ctx.causal, ctx.scale, *prepared
    )
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


invariant_attention.register_autograd(_attn_backward, setup_context=_attn_setup)
