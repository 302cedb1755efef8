"""`fp4_compile::invariant_routing` and its backward op. Validation and documentation live in
`invariant/api.py` (the public API).

Shape legend: M rows, E experts.

- invariant_routing(logits, top_k, norm_topk_prob) -> (weights, experts)
CPU: `invariant/reference.py` (invariant by construction). CUDA: the Triton kernel of
`invariant/routing_kernel.py` (imported lazily); the backward one Triton launch
(`routing_backward_kernel`).
"""

from __future__ import annotations

import torch

from . import reference as cpu

_LIB = "fp4_compile"


@torch.library.custom_op(f"{_LIB}::invariant_routing", mutates_args=())
def invariant_routing(
    logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.is_cuda:
        from . import routing_kernel  # lazy: imports triton

        return routing_kernel.routing(logits, top_k, norm_topk_prob)
    return cpu.routing(logits, top_k, norm_topk_prob)


@invariant_routing.register_fake
def _(logits, top_k, norm_topk_prob):
    m = logits.shape[0]
    return (
        logits.new_empty((m, top_k), dtype=torch.float32),
        logits.new_empty((m, top_k), dtype=torch.int64),
    )


def _routing_setup(ctx, inputs, output):
    logits, _, norm = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.norm = norm


@torch.library.custom_op(f"{_LIB}::invariant_routing_backward", mutates_args=())
def invariant_routing_backward(
    grad_w: torch.Tensor, logits: torch.Tensor, idx: torch.Tensor, norm_topk_prob: bool
) -> torch.Tensor:
    """Through softmax, the top-k gather and the renormalization, FP32, as ONE opaque op so
    eager, Inductor and export compute the same bits. CUDA: one Triton launch
    (`routing_backward_kernel`: the same formula, one row per program in a fixed order; it
    raises for what it does not take: dtypes other than float32 / bfloat16 / float16, more than
    its MAX_EXPERTS = 4096 experts; no fallback); CPU: the plain PyTorch formula below (the
    reference)."""
    if logits.is_cuda:
        from .routing_backward_kernel import routing_backward  # lazy: imports triton

        return routing_backward(grad_w, logits, idx, norm_topk_prob)
    p = torch.softmax(logits.to(torch.float32), dim=-1)
    g = grad_w.to(torch.float32)
    sel = p.gather(-1, idx)
    if norm_topk_prob:
        total = sel.sum(-1, keepdim=True)
        w = sel / total
        g = (g - (g * w).sum(-1, keepdim=True)) / total
    dp = torch.zeros_like(p).scatter_add(-1, idx, g)
    dz = p * (dp - (dp * p).sum(-1, keepdim=True))
    return dz.to(logits.dtype)


@invariant_routing_backward.register_fake
def _(grad_w, logits, idx, norm_topk_prob):
    return torch.empty_like(logits)


def _routing_backward(ctx, grad_w, grad_idx):
    logits, idx = ctx.saved_tensors
    return invariant_routing_backward(grad_w.contiguous(), logits, idx, ctx.norm), None, None


invariant_routing.register_autograd(_routing_backward, setup_context=_routing_setup)
