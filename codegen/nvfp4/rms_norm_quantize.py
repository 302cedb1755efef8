"""`fp4_compile::rms_norm_quantize`: RMSNorm that also emits its NVFP4 GEMM operand (the
producer-fused form of `invariant_rms_norm` followed by `quantize_activation`).

Shape legend: M rows (x's leading dims flattened), M16 = M rounded up to a multiple of 16,
H hidden (a multiple of 16).

rms_norm_quantize(x, weight, eps, recipe, transposed) -> (y, y_ongrid, y_gd, yt_ongrid, yt_gd):
y = `invariant_rms_norm(x, weight, eps)`, and the other four are exactly
`quantize_activation(y, recipe, None, transposed)`'s outputs: y's on-grid BF16 operand [M, H]
with its per-row global decode [M, 1], and, when `transposed`, y^T's on-grid operand [H, M16]
with its per-tensor global decode [] (else both [0]). Only per-row activation scales (the row
is the norm's own: its amax is known before the blocks are encoded); the lowering fuses nothing
else. Autograd: the gradient flows through y only (the norm's backward op); the operands are
not differentiable, as `quantize_activation`'s.
CPU: the references (`invariant.reference.rms_norm`, then `gemm.cpu_activation_operands`).
CUDA: one Triton launch for y, its operand and its row maxima (`rms_norm_quantize_kernel.py`),
then, when `transposed`, the transposed quantize with the per-tensor amax taken from the row
maxima (exact: a max) instead of another read of y.

add_rms_norm_quantize(x, residual, weight, eps, recipe, transposed)
-> (y, y_ongrid, y_gd, yt_ongrid, yt_gd, h): the residual form, for a decoder layer's
`h = x + residual` read by its norm and by the next residual add: h is computed in the norm's
launch (FP32 sum rounded once to x's dtype, as the model's add) and returned last; the other
five are `rms_norm_quantize(h, ...)`'s, bit for bit. Autograd: dh = the norm's backward + the
gradient of h, to x and residual alike (the add's gradient).
"""

from __future__ import annotations

import torch

from ..invariant import reference as norm_ref
from . import gemm as impl

_LIB = "fp4_compile"


def _check(x, weight, recipe):
    if not isinstance(x, torch.Tensor) or x.dtype not in impl.X_DTYPES:
        raise TypeError(
            f"x must be a bfloat16/float32/float16 tensor, got {getattr(x, 'dtype', x)}"
        )
    if x.dim() < 1 or x.shape[-1] % 16:
        raise ValueError(f"x last dim must be a multiple of 16, got shape {tuple(x.shape)}")
    if weight is not None and tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"weight must be [H={x.shape[-1]}], got {tuple(weight.shape)}")
    rec = impl.op_recipe(recipe)
    if rec.activation.global_scale != "per_row":
        raise ValueError(
            "rms_norm_quantize needs per-row activation scales (recipe.activation.global_scale="
            f"'per_row'), got {rec.activation.global_scale!r}"
        )
    return rec


def _cuda_operands(x, weight, eps, transposed, residual=None):
    """(y [M, H], a, gd_a, xt, gd_t, h [M, H]): the kernel (its residual form where given: h is
    the sum, else x), then X^T from the row maxima when `transposed`."""
    from .abs_max_kernel import vector_abs_max  # lazy: imports triton
    from .quantize_kernel import quantize_tokens_transposed_ongrid  # lazy: imports triton
    from .rms_norm_quantize_kernel import add_rms_norm_quantize, rms_norm_quantize  # lazy: triton

    if residual is None:
        y2, a, gd_a, row_amax = rms_norm_quantize(x, weight, eps)
        h2 = x
    else:
        y2, a, gd_a, row_amax, h2 = add_rms_norm_quantize(x, residual, weight, eps)
    if not transposed:
        return y2, a, gd_a, *impl.no_transposed_operand(y2), h2
    amax = vector_abs_max(row_amax) if row_amax.numel() else row_amax.new_zeros(())
    xt, gd_t = quantize_tokens_transposed_ongrid(y2, amax.reshape(1))
    return y2, a, gd_a, xt, gd_t.reshape(()), h2


@torch.library.custom_op(f"{_LIB}::rms_norm_quantize", mutates_args=())
def rms_norm_quantize(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, recipe: str, transposed: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward(x, None, weight, eps, recipe, transposed)[:5]


def _forward(x, residual, weight, eps, recipe, transposed):
    """(y, a, gd_a, xt, gd_t, h) of either op (h: x + residual, or x)."""
    rec = _check(x, weight, recipe)
    if x.device.type == "cuda":
        y2, a, gd_a, xt, gd_t, h2 = _cuda_operands(x, weight, eps, transposed, residual)
        y, h = y2.reshape(x.shape), h2.reshape(x.shape)
    else:
        y, h = norm_ref.rms_norm(x, weight, residual, eps)
        y = y.contiguous()
        a, gd_a, xt, gd_t = impl.cpu_activation_operands(
            y.reshape(-1, x.shape[-1]), rec, None, transposed=transposed
        )
    return y, a, gd_a.contiguous(), xt, gd_t.contiguous(), h


@rms_norm_quantize.register_fake
def _(x, weight, eps, recipe, transposed):
    return _fake(x, weight, recipe, transposed)


def _fake(x, weight, recipe, transposed):
    _check(x, weight, recipe)
    h = x.shape[-1]
    m = x.numel() // h
    y = x.new_empty(x.shape)
    a = x.new_empty((m, h), dtype=torch.bfloat16)
    gd_a = x.new_empty((m, 1), dtype=torch.float32)
    if transposed:
        xt = x.new_empty((h, ((m + 15) // 16) * 16), dtype=torch.bfloat16)
        gd_t = x.new_empty((), dtype=torch.float32)
    else:
        xt = x.new_empty((0,), dtype=torch.bfloat16)
        gd_t = x.new_empty((0,), dtype=torch.float32)
    return y, a, gd_a, xt, gd_t


def _setup(ctx, inputs, output):
    x, weight, eps, _, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad_y, *unused_operand_grads):
    x, weight = ctx.saved_tensors
    dx, dw = torch.ops.fp4_compile.invariant_rms_norm_backward(grad_y, x, weight, ctx.eps)
    return dx, (dw if weight is not None else None), None, None, None


rms_norm_quantize.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op(f"{_LIB}::add_rms_norm_quantize", mutates_args=())
def add_rms_norm_quantize(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    recipe: str,
    transposed: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_residual(x, residual)
    y, a, gd_a, xt, gd_t, h = _forward(x, residual, weight, eps, recipe, transposed)
    return y, a, gd_a, xt, gd_t, h.contiguous()


def _check_residual(x, residual):
    if not isinstance(residual, torch.Tensor) or (residual.shape, residual.dtype) != (
        x.shape,
        x.dtype,
    ):
        raise ValueError(
            f"residual must match x ({tuple(x.shape)}, {x.dtype}), got "
            f"{tuple(getattr(residual, 'shape', ()))}, {getattr(residual, 'dtype', residual)}"
        )


@add_rms_norm_quantize.register_fake
def _(x, residual, weight, eps, recipe, transposed):
    _check_residual(x, residual)
    return (*_fake(x, weight, recipe, transposed), x.new_empty(x.shape))


def _add_setup(ctx, inputs, output):
    _, _, weight, eps, _, _ = inputs
    ctx.save_for_backward(output[5], weight)
    ctx.eps = eps


def _add_backward(ctx, grad_y, *grads):
    h, weight = ctx.saved_tensors
    dh, dw = torch.ops.fp4_compile.invariant_rms_norm_backward(grad_y, h, weight, ctx.eps)
    grad_h = grads[-1]
    if grad_h is not None:
        dh = dh + grad_h
    return dh, dh, (dw if weight is not None else None), None, None, None


add_rms_norm_quantize.register_autograd(_add_backward, setup_context=_add_setup)
