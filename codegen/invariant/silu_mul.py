"""`fp4_compile::silu_mul`: silu(a) * b, the SwiGLU of every gated MLP (dense and MoE experts),
as one opaque op: the compiled graph and the eager graph call the same implementation.

Why opaque: left in the graph, Inductor generates the SwiGLU's forward and backward as its own
Triton kernels, and on the H200 (torch 2.11, whose Inductor lacks
`eager_numerics.use_pytorch_libdevice`) the backward rounded 2 of 50,331,648 gradient elements
differently from eager ATen at the Qwen3-30B-A3B shape
(`benchmarks/results/2026-12-04_elementwise_numerics_gpu_6778eeb.md`, the d76401a run); those two
bytes were enough to make 20 of 25 gradients of the bf16 recipe's 4096-token backend check
differ from the eager lowered graph. As an op, the compiled graph and the eager graph call the
same kernels.

The math is eager autograd's for `F.silu(a) * b`: out = bf16(silu(a)) * b; backward
d_b = grad * silu(a), d_a = silu_backward(grad * b, a). silu(a) is recomputed in the backward
(the same kernel, the same bits) rather than saved. On CUDA (bf16 / FP32) both directions are
one Triton pass each (`silu_mul_kernel`), the same operations as ATen's kernels."""

from __future__ import annotations

import torch

from . import reference as cpu
from .reference import silu_mul_backward as silu_mul_backward_reference


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    if not (a.dtype.is_floating_point and b.dtype.is_floating_point):
        raise TypeError(f"silu_mul is for floating tensors, got a {a.dtype}, b {b.dtype}")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            "silu_mul needs a and b of one shape and dtype: "
            f"a {tuple(a.shape)} {a.dtype}, b {tuple(b.shape)} {b.dtype}"
        )


def _check_mask(a: torch.Tensor, row_mask: torch.Tensor | None) -> None:
    rows = a.shape[:-1]
    if row_mask is not None and (
        row_mask.dtype != torch.bool or tuple(row_mask.shape) not in (tuple(rows), (*rows, 1))
    ):
        raise ValueError(
            f"row_mask must be bool of shape {tuple(rows)} or {(*rows, 1)}, got "
            f"{row_mask.dtype} {tuple(row_mask.shape)}"
        )


@torch.library.custom_op("fp4_compile::silu_mul", mutates_args=())
def silu_mul(
    a: torch.Tensor, b: torch.Tensor, row_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """silu(a) * b; with `row_mask` (bool, one per row): that of a and b with the masked rows
    zeroed first (`x.masked_fill(row_mask, 0)` folded in: `passes/fold_row_masks.py`)."""
    _check(a, b)
    _check_mask(a, row_mask)
    if a.device.type == "cuda":
        from .silu_mul_kernel import kernel_applies, silu_mul_triton  # lazy: imports triton

        if kernel_applies(a, b):
            return silu_mul_triton(a, b, row_mask)
    return cpu.silu_mul(a, b, row_mask)


@silu_mul.register_fake
def _(a, b, row_mask=None):
    _check(a, b)
    _check_mask(a, row_mask)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.custom_op("fp4_compile::silu_mul_backward", mutates_args=())
def silu_mul_backward(
    grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, row_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_a, grad_b); with `row_mask`: the backward of silu_mul on the masked a and b, then
    the masked rows of both gradients +0.0 (`masked_fill`'s own backward)."""
    if a.device.type == "cuda":
        # lazy: imports triton
        from .silu_mul_kernel import kernel_applies, silu_mul_backward_triton

        if kernel_applies(grad, a, b):
            return silu_mul_backward_triton(grad, a, b, row_mask)
    return silu_mul_backward_reference(grad, a, b, row_mask)


@silu_mul_backward.register_fake
def _(grad, a, b, row_mask=None):
    return torch.empty(a.shape, dtype=a.dtype, device=a.device), torch.empty(
        b.shape, dtype=b.dtype, device=b.device
    )


def _setup(ctx, inputs, output):
    a, b, *rest = inputs
    mask = rest[0] if rest else None
    ctx.save_for_backward(a, b, *([] if mask is None else [mask]))


def _backward(ctx, grad):
    a, b, *mask = ctx.saved_tensors
    return (*silu_mul_backward(grad, a, b, mask[0] if mask else None), None)


silu_mul.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------------------------------------
# silu_mul_halves: the SwiGLU of the two last-dim halves of ONE tensor (the gated experts'
# `gate, up = gate_up.chunk(2, dim=-1)`), whose backward writes ONE gradient of that tensor:
# no `cat` of the two halves' gradients (an extra [R, 2C] copy per MoE layer in the learner's
# backward, 0.09 ms on the H200: `passes/fold_swiglu_halves.py`). The same bits as silu_mul on
# the two halves, forward and backward (cat is exact).


def _check_halves(x: torch.Tensor, row_mask: torch.Tensor | None) -> int:
    if not x.dtype.is_floating_point or x.dim() != 2 or x.shape[-1] % 2:
        raise ValueError(
            f"silu_mul_halves needs x a floating [R, 2C] tensor, got {x.dtype} {tuple(x.shape)}"
        )
    c = x.shape[-1] // 2
    _check_mask(x[:, :c], row_mask)
    return c


@torch.library.custom_op("fp4_compile::silu_mul_halves", mutates_args=())
def silu_mul_halves(x: torch.Tensor, row_mask: torch.Tensor | None = None) -> torch.Tensor:
    """silu(x[:, :C]) * x[:, C:] (x [R, 2C]): `silu_mul` on x's halves, bitwise."""
    c = _check_halves(x, row_mask)
    return silu_mul(x[:, :c], x[:, c:], row_mask)


@silu_mul_halves.register_fake
def _(x, row_mask=None):
    c = _check_halves(x, row_mask)
    return torch.empty((x.shape[0], c), dtype=x.dtype, device=x.device)


@torch.library.custom_op("fp4_compile::silu_mul_halves_backward", mutates_args=())
def silu_mul_halves_backward(
    grad: torch.Tensor, x: torch.Tensor, row_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The gradient of x [R, 2C]: silu_mul_backward's (grad_a, grad_b) as its two halves."""
    c = _check_halves(x, row_mask)
    a, b = x[:, :c], x[:, c:]
    if x.device.type == "cuda":
        # lazy: imports triton
        from .silu_mul_kernel import kernel_applies, silu_mul_backward_triton

        if kernel_applies(grad, a, b):
            return silu_mul_backward_triton(grad, a, b, row_mask, into_halves=True)
    return torch.cat(silu_mul_backward(grad, a, b, row_mask), dim=-1)


@silu_mul_halves_backward.register_fake
def _(grad, x, row_mask=None):
    _check_halves(x, row_mask)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _setup_halves(ctx, inputs, output):
    x, *rest = inputs
    mask = rest[0] if rest else None
    ctx.save_for_backward(x, *([] if mask is None else [mask]))


def _backward_halves(ctx, grad):
    x, *mask = ctx.saved_tensors
    return silu_mul_halves_backward(grad, x, mask[0] if mask else None), None


silu_mul_halves.register_autograd(_backward_halves, setup_context=_setup_halves)
