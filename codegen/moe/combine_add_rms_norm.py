"""`fp4_compile::moe_combine_add_rms_norm`: the MoE block's top-k combine folded into the residual
add + RMSNorm that reads it (`passes/fuse_combine_into_norms.py`), inference only (no backward):

    c = moe_combine(x, w, idx, k)                       # [T, H]
    y, h = invariant_add_rms_norm(residual, c.view(residual.shape), weight, eps)
        -> y, h = moe_combine_add_rms_norm(residual, x, w, idx, k, weight, eps)

Bitwise the two ops, by definition: off the kernel it IS their composition (the ops themselves,
so each dispatches as it would), and the CUDA kernel (`combine_add_rms_norm_kernel`) runs their
kernels' code (`combine_tokens`, `rms_norm_values`). h = residual + c is one FP32 add rounded
once; an add is commutative bit for bit, so c + residual gives the same h.
Shape legend: S slots (= T tokens x k), H hidden; residual any shape of T x H elements, [.., H].
"""

from __future__ import annotations

import torch

from .combine import check_combine_args

KERNEL_DTYPES = (torch.bfloat16,)


def check_combine_residual(
    residual: torch.Tensor, x: torch.Tensor, w: torch.Tensor, k: int
) -> None:
    t, hdim = x.shape[0] // k, x.shape[1]
    dtype = torch.promote_types(x.dtype, w.dtype)
    if residual.dtype != dtype or residual.shape[-1:] != (hdim,) or residual.numel() != t * hdim:
        raise ValueError(
            f"residual must be {dtype} [.., H={hdim}] of T*H={t * hdim} elements (the combine's "
            f"output), got {residual.dtype} {tuple(residual.shape)}"
        )


def _on_kernel(residual, x, w, weight) -> bool:
    tensors = (residual, x, w) if weight is None else (residual, x, w, weight)
    return (
        x.device.type == "cuda" and x.numel() > 0 and all(t.dtype in KERNEL_DTYPES for t in tensors)
    )


@torch.library.custom_op("fp4_compile::moe_combine_add_rms_norm", mutates_args=())
def moe_combine_add_rms_norm(
    residual: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    idx: torch.Tensor,
    k: int,
    weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h) of `invariant_add_rms_norm(residual, moe_combine(x, w, idx, k), weight, eps)`."""
    check_combine_args(x, w, idx, k)
    check_combine_residual(residual, x, w, k)
    if _on_kernel(residual, x, w, weight):
        from .combine_add_rms_norm_kernel import moe_combine_add_rms_norm_triton  # lazy: triton

        y, h = moe_combine_add_rms_norm_triton(residual, x, w, idx, k, weight, eps)
        return y.contiguous(), h.contiguous()
    ops = torch.ops.fp4_compile
    c = ops.moe_combine(x, w, idx, k)
    return ops.invariant_add_rms_norm(residual, c.view(residual.shape), weight, eps)


@moe_combine_add_rms_norm.register_fake
def _(residual, x, w, idx, k, weight, eps):
    check_combine_args(x, w, idx, k)
    check_combine_residual(residual, x, w, k)
    return residual.new_empty(residual.shape), residual.new_empty(residual.shape)
