"""`fp4_compile::silu_mul`: silu(a) * b, the SwiGLU of every gated MLP (dense and MoE experts),
as one opaque op: the compiled graph and the eager graph call the same implementation.

Why opaque: left in the graph, Inductor generates the SwiGLU's forward and backward as its own
Triton kernels, and on the H200 (torch 2.11, whose Inductor lacks
`eager_numerics.use_pytorch_libdevice`) the backward rounded 2 of 50,331,648 gradient elements
differently from eager ATen at the Qwen3-30B-A3B shape
(`benchmarks/results/2026-12-04_elementwise_numerics_gpu_d76401a.md`); those two bytes were
enough to make 20 of 25 gradients of the bf16 recipe's 4096-token backend check differ from the
eager lowered graph. As an op, the compiled graph and the eager graph call the same kernels.

The math is eager autograd's for `F.silu(a) * b`: out = bf16(silu(a)) * b; backward
d_b = grad * silu(a), d_a = silu_backward(grad * b, a). silu(a) is recomputed in the backward
(the same kernel, the same bits) rather than saved. On CUDA (bf16 / FP32) both directions are
one Triton pass each (`silu_mul_kernel`), the same operations as ATen's kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    if not (a.dtype.is_floating_point and b.dtype.is_floating_point):
        raise TypeError(f"silu_mul is for floating tensors, got a {a.dtype}, b {b.dtype}")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            "silu_mul needs a and b of one shape and dtype: "
            f"a {tuple(a.shape)} {a.dtype}, b {tuple(b.shape)} {b.dtype}"
        )


@torch.library.custom_op("fp4_compile::silu_mul", mutates_args=())
def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check(a, b)
    if a.device.type == "cuda":
        from .silu_mul_kernel import kernel_applies, silu_mul_triton

        if kernel_applies(a, b):
            return silu_mul_triton(a, b)
    return (F.silu(a) * b).contiguous()  # the layout the fake promises, whatever a's is


@silu_mul.register_fake
def _(a, b):
    _check(a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.custom_op("fp4_compile::silu_mul_backward", mutates_args=())
def silu_mul_backward(
    grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if a.device.type == "cuda":
        from .silu_mul_kernel import kernel_applies, silu_mul_backward_triton

        if kernel_applies(grad, a, b):
            return silu_mul_backward_triton(grad, a, b)
    return silu_mul_backward_reference(grad, a, b)


def silu_mul_backward_reference(grad, a, b):
    """Eager autograd's backward of F.silu(a) * b, as ATen ops (the CPU implementation)."""
    grad_b = grad * F.silu(a)
    grad_a = aten.silu_backward(grad * b, a)
    return grad_a.contiguous(), grad_b.contiguous()


@silu_mul_backward.register_fake
def _(grad, a, b):
    return torch.empty(a.shape, dtype=a.dtype, device=a.device), torch.empty(
        b.shape, dtype=b.dtype, device=b.device
    )


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    a, b = ctx.saved_tensors
    return silu_mul_backward(grad, a, b)


silu_mul.register_autograd(_backward, setup_context=_setup)
