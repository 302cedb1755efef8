"""`fp4_compile::silu_mul_halves_quantize`: the experts' SwiGLU that also emits its NVFP4 GEMM
operand (the producer-fused form of `silu_mul_halves` followed by the down GEMM's own per-row
quantize of its input).

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

from ..invariant.silu_mul import silu_mul_halves, silu_mul_halves_backward
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
    rec = impl.op_recipe(recipe)
    if rec.activation.global_scale != "per_row":
        raise ValueError(
            "silu_mul_halves_quantize needs per-row activation scales (recipe.activation."
            f"global_scale='per_row'), got {rec.activation.global_scale!r}"
        )
    return rec


@torch.library.custom_op(f"{_LIB}::silu_mul_halves_quantize", mutates_args=())
def silu_mul_halves_quantize(
    x: torch.Tensor, row_mask: torch.Tensor | None, recipe: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rec = _check(x, recipe)
    c = x.shape[-1] // 2
    if x.device.type == "cuda":
        from .silu_mul_quantize_kernel import silu_mul_quantize

        return silu_mul_quantize(x[:, :c], x[:, c:], row_mask)
    y = silu_mul_halves(x, row_mask)
    a, gd_a, _, _ = impl.cpu_activation_operands(y, rec, None, transposed=False)
    return y, a, gd_a.contiguous()


@silu_mul_halves_quantize.register_fake
def _(x, row_mask, recipe):
    _check(x, recipe)
    r, c = x.shape[0], x.shape[-1] // 2
    return (x.new_empty((r, c)), x.new_empty((r, c), dtype=torch.bfloat16),
            x.new_empty((r, 1), dtype=torch.float32))  # fmt: skip


def _setup(ctx, inputs, output):
    x, row_mask, _ = inputs
    ctx.save_for_backward(x, *([] if row_mask is None else [row_mask]))


def _backward(ctx, grad_y, *unused_operand_grads):
    x, *mask = ctx.saved_tensors
    return silu_mul_halves_backward(grad_y, x, mask[0] if mask else None), None, None


silu_mul_halves_quantize.register_autograd(_backward, setup_context=_setup)
