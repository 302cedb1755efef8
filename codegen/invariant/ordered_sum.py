"""`fp4_compile::ordered_sum`: a sum over ONE small dimension in a fixed, written-out order
((x0 + x1) + x2) + ..., as elementwise adds. It replaces the small reductions left in a lowered
graph (MoE top-k combine, top-k renormalization), so eager, Inductor and export all add the
same numbers in the same order on every device, whatever the batch. On CUDA (FP32, BF16) one
Triton pass (`group_sum_kernel`) with the same roundings."""

from __future__ import annotations

import math

import torch

MAX_EXTENT = 64


def _ordered_sum(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    from .group_sum_kernel import KERNEL_DTYPES, group_sum  # lazy: imports triton

    if x.device.type == "cuda" and x.dtype in KERNEL_DTYPES:  # one pass, the same roundings
        dim = dim % x.dim()
        shape = list(x.shape)
        a, c = math.prod(shape[:dim]), math.prod(shape[dim + 1 :])
        out = group_sum(x.reshape(a, shape[dim], c), round_each=True, out_dtype=x.dtype)
        shape[dim] = 1
        out = out.reshape(shape)
        return out if keepdim else out.squeeze(dim)
    return ordered_sum_torch(x, dim, keepdim)


def ordered_sum_torch(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    """The op's math as torch ops (CPU; the kernel's reference)."""
    parts = x.unbind(dim)
    acc = parts[0].clone()
    for p in parts[1:]:
        acc = acc + p
    return acc.unsqueeze(dim) if keepdim else acc


@torch.library.custom_op("fp4_compile::ordered_sum", mutates_args=())
def ordered_sum(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    if not x.dtype.is_floating_point:
        raise TypeError(f"ordered_sum is for floating tensors, got {x.dtype}")
    if x.shape[dim] == 0 or x.shape[dim] > MAX_EXTENT:
        raise ValueError(
            f"ordered_sum reduces 1..{MAX_EXTENT} elements, got extent {x.shape[dim]} at dim {dim}"
        )
    return _ordered_sum(x, dim, keepdim)


@ordered_sum.register_fake
def _(x, dim, keepdim):
    shape = list(x.shape)
    if keepdim:
        shape[dim] = 1
    else:
        shape.pop(dim)
    return x.new_empty(shape)


def _setup(ctx, inputs, output):
    x, dim, keepdim = inputs
    ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim


def _backward(ctx, grad):
    g = grad if ctx.keepdim else grad.unsqueeze(ctx.dim)
    return g.expand(ctx.shape).contiguous(), None, None


ordered_sum.register_autograd(_backward, setup_context=_setup)
