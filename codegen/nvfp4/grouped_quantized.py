"""The experts' NVFP4 GEMM on a pre-quantized activation: `nvfp4_grouped_mm` whose forward reads
x's per-row operand emitted by its producer (`rms_norm_quantize`: the MoE block's normed X)
instead of quantizing x itself.

Shape legend: M rows of x, T tokens sorted by expert (x_index: T gathered rows of x), K
in-features, N out-features, E experts.

nvfp4_grouped_mm_quantized(x, weight, w_codes, w_scales, w_global_decode, offsets, x_amax,
recipe, w_ongrid, site, x_index, x_perm, x_ongrid, x_gd) -> y, registered from `gemm_call`'s
table: the first twelve arguments are `nvfp4_grouped_mm`'s at the same positions
(`gemm_call.OP_ARGS`); x_ongrid (BF16 [M, K]) and x_gd (FP32 [M, 1]) are x's 1x16 per-row quantization, exactly what `nvfp4_grouped_mm` computes for
itself under per-row activation scales (a gathered row's quantization is its source row's: the
blocks and the scale are row-local), so the bits are the same. Per-row recipes only. The
backward is `nvfp4_grouped_mm_backward` unchanged (it reads x; the forward operand plays no part).
"""

from __future__ import annotations

import torch

from . import gemm as impl
from .gemm_call import GemmCall, register_gemm
from .grouped_linear import grouped_backward, grouped_setup_context


def _check(x, rec, x_ongrid, x_gd, offsets, num_experts, x_index):
    if rec.activation.global_scale != "per_row":
        raise ValueError(
            "nvfp4_grouped_mm_quantized needs per-row activation scales (recipe.activation."
            f"global_scale='per_row'), got {rec.activation.global_scale!r}"
        )
    check_operands(x, x_ongrid, x_gd, offsets, num_experts, x_index)
    return rec


def check_operands(x, x_ongrid, x_gd, offsets, num_experts, x_index):
    """x [M, K]'s per-row operand (x_ongrid BF16 [M, K], x_gd FP32 [M, 1]), offsets int32 [E],
    x_index int32/int64 [T] or None (`grouped_parts.py` checks its operands with it too)."""
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got {tuple(x.shape)}")
    if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int32:
        raise TypeError(f"offsets must be int32, got {getattr(offsets, 'dtype', offsets)}")
    if offsets.dim() != 1 or offsets.numel() != num_experts:
        raise ValueError(f"offsets must have shape [{num_experts}], got {tuple(offsets.shape)}")
    if x_index is not None and (
        x_index.dim() != 1 or x_index.dtype not in (torch.int32, torch.int64)
    ):
        raise ValueError(
            f"x_index must be int32/int64 [T], got {x_index.dtype}{list(x_index.shape)}"
        )
    if x_ongrid.dtype != torch.bfloat16 or tuple(x_ongrid.shape) != tuple(x.shape):
        raise ValueError(
            f"x_ongrid must be bfloat16 {list(x.shape)} (x's on-grid operand), got "
            f"{x_ongrid.dtype}{list(x_ongrid.shape)}"
        )
    if x_gd.dtype != torch.float32 or tuple(x_gd.shape) != (x.shape[0], 1):
        raise ValueError(
            f"x_gd must be float32 [{x.shape[0]}, 1] (per-row global decodes), got "
            f"{x_gd.dtype}{list(x_gd.shape)}"
        )


def _forward(call: GemmCall) -> torch.Tensor:
    x, offsets, w_ongrid, x_index = call.x, call.offsets, call.w_ongrid, call.x_index
    w_codes, w_scales, w_global_decode = call.weight_operand()
    x_ongrid, x_gd = call.x_operands[:2]
    n, k = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=True, w_ongrid=w_ongrid)
    _check(x, call.recipe, x_ongrid, x_gd, offsets, w_codes.shape[0], x_index)
    if x.device.type == "cuda":
        return impl.cuda_grouped_quantized(
            x_ongrid, x_gd, w_codes, w_scales, w_global_decode, w_ongrid, offsets, x.dtype, x_index
        )
    w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
    return impl.cpu_grouped_quantized(x_ongrid, x_gd, w, offsets, x_index).to(x.dtype)


def _fake(call: GemmCall) -> torch.Tensor:
    x, x_index, w = call.x, call.x_index, call.weight_operand()
    n, _ = impl.check_weight(x, *w, experts=True, w_ongrid=call.w_ongrid)
    _check(x, call.recipe, *call.x_operands[:2], call.offsets, w.codes.shape[0], x_index)
    return x.new_empty((x.shape[0] if x_index is None else x_index.shape[0], n))


def _setup(ctx, inputs, output):
    grouped_setup_context(ctx, inputs, output, op_name="nvfp4_grouped_mm_quantized")


nvfp4_grouped_mm_quantized = register_gemm(
    "nvfp4_grouped_mm_quantized", _forward, _fake, setup_context=_setup, backward=grouped_backward
)
