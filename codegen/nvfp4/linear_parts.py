"""`fp4_compile::nvfp4_linear_with_parts`: `nvfp4_linear`'s forward with x's partial row maxima
given by its producer, so that the decode GEMM's prologue reads them instead of a
`chunk_abs_max` launch (issue 53: the attention output projection reading
`invariant_attention_parts`' per-head maxima). Inference only (no autograd).

Shape legend: M rows (x's leading dims flattened), K in-features, N out-features, P partial
maxima per row (any split of the row: the prologue folds them with a max, exact in any
grouping).

nvfp4_linear_with_parts(x, x_parts, w_codes, w_scales, w_global_decode, w_ongrid, bias, recipe)
-> y [.., N]: `nvfp4_linear(x, ..)`'s forward bit for bit (no x_amax: per-row activation
scales). CUDA: `gemm_cuda.cuda_linear` with `x_parts`: where it would take chunk maxima for the
decode kernel's prologue (`few_row_parts`) it takes x_parts, elsewhere it runs as it does (x_parts
unread); CPU: `gemm.cpu_linear`, as `nvfp4_linear`. `passes/emit_attention_parts.py` makes it.
"""

from __future__ import annotations

import torch

from . import gemm as impl

_LIB = "fp4_compile"


@torch.library.custom_op(f"{_LIB}::nvfp4_linear_with_parts", mutates_args=())
def nvfp4_linear_with_parts(
    x: torch.Tensor,
    x_parts: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_decode: torch.Tensor,
    w_ongrid: torch.Tensor | None,
    bias: torch.Tensor | None,
    recipe: str,
) -> torch.Tensor:
    n, k = impl.check_weight(
        x, w_codes, w_scales, w_global_decode, experts=False, w_ongrid=w_ongrid
    )
    rec = impl.op_recipe(recipe)
    x2 = x.reshape(-1, k)
    if x_parts.dtype != torch.float32 or x_parts.dim() != 2 or x_parts.shape[0] != x2.shape[0]:
        raise ValueError(
            f"x_parts must be FP32 [M={x2.shape[0]}, P], got {x_parts.dtype}{list(x_parts.shape)}"
        )
    if rec.activation.global_scale != "per_row":
        raise ValueError(
            "nvfp4_linear_with_parts needs per-row activation scales, got "
            f"{rec.activation.global_scale!r}"
        )
    if x.device.type == "cuda":
        y = impl.cuda_linear(
            x2, w_codes, w_scales, w_global_decode, w_ongrid, bias, rec, None, x_parts=x_parts
        )
    else:
        w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
        y = impl.cpu_linear(x2, w, bias, rec, None)
    return y.reshape(*x.shape[:-1], n)


@nvfp4_linear_with_parts.register_fake
def _(x, x_parts, w_codes, w_scales, w_global_decode, w_ongrid, bias, recipe):
    n, _ = impl.weight_nk(w_codes, w_ongrid)
    return x.new_empty((*x.shape[:-1], n))
