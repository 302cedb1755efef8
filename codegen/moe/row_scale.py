"""`fp4_compile::row_scale`: x[..., H] * w[..., 1] (MoE routing weights times expert outputs),
with a backward whose reduction is written out. Autograd of a plain broadcasting multiply sums
grad * x over H with whatever kernel runs it (eager, Inductor's generated reduction): two orders,
two answers, and the router's gradient differed (tests/passes/test_lowering_equivalence.py).
Here d(w) = block_sum(grad * x) over H in a fixed order (`invariant/fixed_order.py`), in FP32, as an
opaque op, so eager, Inductor and every batch size add the same numbers in the same order. On CUDA
forward and backward are Triton passes (`row_scale_kernel`), bitwise these torch ops."""

from __future__ import annotations

import torch

from .reference import ROW_SCALE_BLOCK as BLOCK
from .reference import row_scale_backward_reference

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(x: torch.Tensor, w: torch.Tensor) -> None:
    if not (x.dtype.is_floating_point and w.dtype.is_floating_point):
        raise TypeError(f"row_scale is for floating tensors, got x {x.dtype}, w {w.dtype}")
    if w.dim() != x.dim() or w.shape[-1] != 1 or w.shape[:-1] != x.shape[:-1]:
        raise ValueError(
            f"row_scale needs w of shape x.shape[:-1] + (1,): x {tuple(x.shape)}, w {tuple(w.shape)}"
        )


@torch.library.custom_op("fp4_compile::row_scale", mutates_args=())
def row_scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _check(x, w)
    if x.device.type == "cuda" and x.dtype in KERNEL_DTYPES and w.dtype in KERNEL_DTYPES:
        # lazy: imports triton
        from .row_scale_kernel import row_scale_triton  # the same bits as x * w

        return row_scale_triton(x, w)
    return x * w


@row_scale.register_fake
def _(x, w):
    _check(x, w)
    return torch.empty(x.shape, dtype=torch.promote_types(x.dtype, w.dtype), device=x.device)


@torch.library.custom_op("fp4_compile::row_scale_backward", mutates_args=())
def row_scale_backward(
    grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    on_kernel = all(t.dtype in KERNEL_DTYPES for t in (grad, x, w))
    if x.device.type == "cuda" and x.shape[-1] and on_kernel:
        # lazy: imports triton
        from .row_scale_kernel import row_scale_backward_triton  # one pass, the same bits

        return row_scale_backward_triton(grad, x, w, BLOCK)
    return row_scale_backward_reference(grad, x, w)


@row_scale_backward.register_fake
def _(grad, x, w):
    return torch.empty_like(x), torch.empty_like(w)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    grad_x, grad_w = row_scale_backward(grad.contiguous(), x, w)
    return grad_x, grad_w


row_scale.register_autograd(_backward, setup_context=_setup)
