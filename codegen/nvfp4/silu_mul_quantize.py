"""`fp4_compile::silu_mul_halves_quantize` and `::silu_mul_quantize`: the SwiGLU that also emits
its NVFP4 GEMM operand (the producer-fused form of `silu_mul_halves` / `silu_mul` followed by the
down GEMM's own per-row quantize of its input). `silu_mul_quantize` (a dense MLP's: a, b two
tensors) is documented at its definition below.

Shape legend: R rows (tokens sorted by expert), C = I columns (moe_intermediate, a multiple of 16).

silu_mul_halves_quantize(x, row_mask, recipe) -> (y, y_ongrid, y_gd): y = `silu_mul_halves(x,
row_mask)` [R, C], and y's 1x16 per-row quantization, on-grid BF16 [R, C] with its global decode
[R, 1]: what `nvfp4_grouped_mm` computes for itself from y under per-row activation scales (the
only scales the lowering fuses). Autograd: the gradient flows through y only (silu_mul_halves'
backward op); the operand is not differentiable.
CPU: the references (`silu_mul_halves`, then `gemm.cpu_activation_operands`). CUDA (bf16 / FP32):
one Triton launch (`silu_mul_quantize_kernel.py`).
"""

from __future__ import annotations

import torch

from ..invariant.silu_mul import (
    silu_mul,
    silu_mul_backward,
    silu_mul_halves,
    silu_mul_halves_backward,
)
from . import gemm as impl

_LIB = "fp4_compile"
KERNEL_DTYPES = (torch.bfloat16, torch.float32)


def _check(x, recipe):
    if not isinstance(x, torch.Tensor) or x.dtype not in KERNEL_DTYPES or x.dim() != 2:
        raise ValueError(
            f"x must be a bfloat16/float32 [R, 2C] tensor, got {getattr(x, 'dtype', x)} "
            f"{tuple(getattr(x, 'shape', ()))}"
        )
    if x.shape[-1] % 32:
        raise ValueError(f"x last dim 2C must be a multiple of 32, got {x.shape[-1]}")
    return _check_recipe(recipe, "silu_mul_halves_quantize")


def _check_recipe(recipe, op):
    rec = impl.op_recipe(recipe)
    if rec.activation.global_scale != "per_row":
        raise ValueError(
            f"{op} needs per-row activation scales (recipe.activation.global_scale='per_row'), "
            f"got {rec.activation.global_scale!r}"
        )
    return rec


@torch.library.custom_op(f"{_LIB}::silu_mul_halves_quantize", mutates_args=())
def silu_mul_halves_quantize(
    x: torch.Tensor, row_mask: torch.Tensor | None, recipe: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rec = _check(x, recipe)
    c = x.shape[-1] // 2
    if x.device.type == "cuda":
        from .silu_mul_quantize_kernel import silu_mul_quantize  # lazy: imports triton

        return silu_mul_quantize(x[:, :c], x[:, c:], row_mask)[:3]
    y = silu_mul_halves(x, row_mask)
    a, gd_a, _, _ = impl.cpu_activation_operands(y, rec, None, transposed=False)
    return y, a, gd_a.contiguous()


@silu_mul_halves_quantize.register_fake
def _(x, row_mask, recipe):
    _check(x, recipe)
    r, c = x.shape[0], x.shape[-1] // 2
    return (
        x.new_empty((r, c)),
        x.new_empty((r, c), dtype=torch.bfloat16),
        x.new_empty((r, 1), dtype=torch.float32),
    )


def _setup(ctx, inputs, output):
    x, row_mask, _ = inputs
    ctx.save_for_backward(x, *([] if row_mask is None else [row_mask]))


def _backward(ctx, grad_y, *unused_operand_grads):
    x, *mask = ctx.saved_tensors
    return silu_mul_halves_backward(grad_y, x, mask[0] if mask else None), None, None


silu_mul_halves_quantize.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------------------------------------
# silu_mul_quantize: a dense gated MLP's SwiGLU silu(a) * b emitting the down projection's
# operand, and (transposed) its wgrad's X^T operand.


def _check_pair(a, b, recipe):
    if not isinstance(a, torch.Tensor) or a.dtype not in KERNEL_DTYPES:
        raise ValueError(f"a must be a bfloat16/float32 tensor, got {getattr(a, 'dtype', a)}")
    if not isinstance(b, torch.Tensor) or b.shape != a.shape or b.dtype != a.dtype:
        raise ValueError(f"b must match a {a.dtype}{list(a.shape)}, got {b.dtype}{list(b.shape)}")
    if a.dim() < 1 or a.shape[-1] % 16:
        raise ValueError(f"a last dim must be a multiple of 16, got shape {tuple(a.shape)}")
    return _check_recipe(recipe, "silu_mul_quantize")


def _cuda_pair(a, b, row_mask, rec, transposed):
    from ..invariant.silu_mul_kernel import kernel_applies  # lazy: imports triton
    from .abs_max_kernel import vector_abs_max  # lazy: imports triton
    from .quantize_kernel import quantize_tokens_transposed_ongrid  # lazy: imports triton
    from .silu_mul_quantize_kernel import silu_mul_quantize as kernel  # lazy: imports triton

    c = a.shape[-1]
    if not kernel_applies(a, b):  # silu_mul's own non-kernel path, then the quantize: same bits
        y = silu_mul(a, b, row_mask)
        return y, *impl.cuda_activation_operands(y.reshape(-1, c), rec, None, transposed=transposed)
    y2, ongrid, gd, row_amax = kernel(a.reshape(-1, c), b.reshape(-1, c), row_mask)
    y = y2.reshape(a.shape)
    if not transposed:
        return y, ongrid, gd, *impl.no_transposed_operand(y2)
    amax = vector_abs_max(row_amax) if row_amax.numel() else row_amax.new_zeros(())
    xt, gd_t = quantize_tokens_transposed_ongrid(y2, amax.reshape(1))
    return y, ongrid, gd, xt, gd_t.reshape(())


@torch.library.custom_op(f"{_LIB}::silu_mul_quantize", mutates_args=())
def silu_mul_quantize(
    a: torch.Tensor, b: torch.Tensor, row_mask: torch.Tensor | None, recipe: str, transposed: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y = `silu_mul(a, b, row_mask)`, then `quantize_activation(y, recipe, None,
    transposed)`'s four outputs), per-row activation scales only. CUDA: one Triton launch for y,
    its operand and its row maxima, then (transposed) X^T's quantize with the per-tensor amax
    taken from the row maxima; where silu_mul's kernel does not apply (strides), silu_mul and
    the quantize kernels one after the other (the same bits). CPU: the references."""
    rec = _check_pair(a, b, recipe)
    if a.device.type == "cuda":
        y, x_ongrid, x_gd, xt, gd_t = _cuda_pair(a, b, row_mask, rec, transposed)
    else:
        y = silu_mul(a, b, row_mask)
        x_ongrid, x_gd, xt, gd_t = impl.cpu_activation_operands(
            y.reshape(-1, a.shape[-1]), rec, None, transposed=transposed
        )
    return y.contiguous(), x_ongrid, x_gd.contiguous(), xt, gd_t.contiguous()


@silu_mul_quantize.register_fake
def _(a, b, row_mask, recipe, transposed):
    _check_pair(a, b, recipe)
    c = a.shape[-1]
    m = a.numel() // c
    y = a.new_empty(a.shape)
    x_ongrid = a.new_empty((m, c), dtype=torch.bfloat16)
    x_gd = a.new_empty((m, 1), dtype=torch.float32)
    if transposed:
        xt = a.new_empty((c, ((m + 15) // 16) * 16), dtype=torch.bfloat16)
        gd_t = a.new_empty((), dtype=torch.float32)
    else:
        xt = a.new_empty((0,), dtype=torch.bfloat16)
        gd_t = a.new_empty((0,), dtype=torch.float32)
    return y, x_ongrid, x_gd, xt, gd_t


def _setup_pair(ctx, inputs, output):
    a, b, row_mask, _, _ = inputs
    ctx.save_for_backward(a, b, *([] if row_mask is None else [row_mask]))


def _backward_pair(ctx, grad_y, *unused_operand_grads):
    a, b, *mask = ctx.saved_tensors
    grad_a, grad_b = silu_mul_backward(grad_y, a, b, mask[0] if mask else None)
    return grad_a, grad_b, None, None, None


silu_mul_quantize.register_autograd(_backward_pair, setup_context=_setup_pair)
