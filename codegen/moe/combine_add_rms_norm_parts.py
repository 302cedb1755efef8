"""`fp4_compile::moe_combine_add_rms_norm_parts`: the MoE block's top-k combine folded into the
next layer's strict input norm, the residual add + RMSNorm that leaves its codes to the q/k/v
decode GEMM's prologue (`nvfp4/norm_parts.py`'s `rms_norm_quantize_parts`), inference only
(no backward; `passes/fuse_combine_into_norms.fuse_combine_into_norm_parts`):

    c = moe_combine(x, w, idx, k)                                        # [T, H]
    y, a, gd, parts, h = rms_norm_quantize_parts(c.view(residual.shape), residual, weight, eps,
                                                 recipe)
        -> y, a, gd, parts, h = moe_combine_add_rms_norm_parts(residual, x, w, idx, k, weight,
                                                               eps, recipe)

Bitwise the two ops, by definition: where `rms_norm_quantize_parts` runs its first launch alone
(a CUDA decode: `norm_parts.codes_deferred`) and everything is BF16, one launch of
`combine_add_rms_norm_kernel`'s parts form (the combine's, the norm's and `rms_norm_amax`'s
code: y, h, the row maxima; a and gd are then not written, as there); anywhere else it IS the
two ops' composition (each dispatches as it would). h = c + residual is one FP32 add rounded
once, commutative bit for bit: the combine may have been either addend.
Shape legend: S slots (= T tokens x k), H hidden (a multiple of 16); residual [.., H] of T x H.
"""

from __future__ import annotations

import torch

from ..nvfp4 import norm_parts
from ..nvfp4 import rms_norm_quantize as norm_quantize
from ..runtime import kernel_target
from .combine import check_combine_args
from .combine_add_rms_norm import KERNEL_DTYPES, check_combine_residual


def _fused(residual, x, w, weight) -> bool:
    """Whether the one launch runs: `rms_norm_quantize_parts` would run `rms_norm_amax` alone."""
    tensors = (residual, x, w) if weight is None else (residual, x, w, weight)
    if not norm_parts._kernels(residual) or any(t.dtype not in KERNEL_DTYPES for t in tensors):
        return False
    t = residual.numel() // residual.shape[-1]
    return norm_parts.codes_deferred(kernel_target(residual).arch, t)


@torch.library.custom_op("fp4_compile::moe_combine_add_rms_norm_parts", mutates_args=())
def moe_combine_add_rms_norm_parts(
    residual: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    idx: torch.Tensor,
    k: int,
    weight: torch.Tensor | None,
    eps: float,
    recipe: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rms_norm_quantize_parts(moe_combine(x, w, idx, k), residual, weight, eps, recipe)`."""
    check_combine_args(x, w, idx, k)
    check_combine_residual(residual, x, w, k)
    norm_quantize._check(residual, weight, recipe)
    if _fused(residual, x, w, weight):
        from .combine_add_rms_norm_kernel import moe_combine_add_rms_norm_amax  # lazy: triton

        y, parts, h = moe_combine_add_rms_norm_amax(residual, x, w, idx, k, weight, eps)
        m, hdim = parts.shape[0], residual.shape[-1]
        a = torch.empty((m, hdim), dtype=torch.bfloat16, device=x.device)  # not written
        gd = torch.empty((m, 1), dtype=torch.float32, device=x.device)  # not written
        return y.contiguous(), a, gd, parts, h.contiguous()
    ops = torch.ops.fp4_compile
    c = ops.moe_combine(x, w, idx, k)
    return ops.rms_norm_quantize_parts(c.view(residual.shape), residual, weight, eps, recipe)


@moe_combine_add_rms_norm_parts.register_fake
def _(residual, x, w, idx, k, weight, eps, recipe):
    check_combine_args(x, w, idx, k)
    check_combine_residual(residual, x, w, k)
    norm_quantize._check(residual, weight, recipe)
    m, hdim = x.shape[0] // k, residual.shape[-1]
    return (
        residual.new_empty(residual.shape),
        residual.new_empty((m, hdim), dtype=torch.bfloat16),
        residual.new_empty((m, 1), dtype=torch.float32),
        residual.new_empty((m, 1), dtype=torch.float32),
        residual.new_empty(residual.shape),
    )
