"""`fp4_compile::invariant_linear` (and its backward op): y = x @ weight^T + bias, batch-invariant.
Validation and documentation live in `invariant/api.py` (the public API).

Shape legend: M rows, K in-features, N out-features.

- invariant_linear(x, weight, bias, out_dtype) -> y;  invariant_linear_backward(...) -> (dx, dw, db)
CPU: `invariant/reference.py` (invariant by construction). CUDA: the Triton kernel of
`invariant/linear_kernel.py` (imported lazily); the backward in plain PyTorch.
"""

from __future__ import annotations

import torch

from . import reference as cpu

_LIB = "fp4_compile"


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


@torch.library.custom_op(f"{_LIB}::invariant_linear", mutates_args=())
def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    x2 = _flat(x)
    if x.is_cuda:
        from . import linear_kernel  # lazy: imports triton

        y = linear_kernel.linear(x2, weight, bias, out_dtype)
    else:
        y = cpu.linear(x2, weight, bias, out_dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


@invariant_linear.register_fake
def _(x, weight, bias, out_dtype):
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=out_dtype)


def _linear_setup(ctx, inputs, output):
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None


@torch.library.custom_op(f"{_LIB}::invariant_linear_backward", mutates_args=())
def invariant_linear_backward(
    grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dX = dY @ W, dW = dY^T @ X, db = sum(dY), with plain matmuls accumulating in FP32, each
    rounded to its operand's dtype: deterministic, not invariant. BF16/FP16 operands (x and W of
    one 16-bit dtype): dY is rounded to that dtype and the GEMMs run in it (tensor cores, FP32
    accumulation: what a BF16 layer's backward does; an FP32 lm_head backward was 5 ms of a
    74 ms H200 learner step); otherwise FP32. ONE opaque op, so Inductor cannot fuse away the
    roundings (eager, Inductor and export give the same bits)."""
    g = _flat(grad_y)
    half = x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
    gemm_dtype = x.dtype if half else torch.float32
    # dY in the GEMM dtype: one rounding from its exact value (no copy when it already is;
    # through FP32 it was two [T, N] copies, 0.1 ms per step for the learner's lm_head)
    g_op = g.to(gemm_dtype)
    dx = (g_op @ weight.to(gemm_dtype)).to(x.dtype).reshape(x.shape)
    dw = (g_op.t() @ _flat(x).to(gemm_dtype)).to(weight.dtype)
    db = g.to(torch.float32).sum(0) if has_bias else g.new_zeros(0, dtype=torch.float32)
    return dx.contiguous(), dw.contiguous(), db


@invariant_linear_backward.register_fake
def _(grad_y, x, weight, has_bias):
    db = grad_y.new_empty((weight.shape[0],) if has_bias else (0,), dtype=torch.float32)
    return x.new_empty(x.shape), weight.new_empty(weight.shape), db


def _linear_backward(ctx, grad_y):
    x, weight = ctx.saved_tensors
    dx, dw, db = invariant_linear_backward(grad_y.contiguous(), x, weight, ctx.has_bias)
    return dx, dw, (db.to(ctx.bias_dtype) if ctx.has_bias else None), None


invariant_linear.register_autograd(_linear_backward, setup_context=_linear_setup)
