"""Device implementations behind the fp4_compile:: NVFP4 ops (forward and backward math).

Shape legend: M tokens (x's leading dims flattened), T tokens sorted by expert, K in-features,
N out-features, E experts.

CPU: the reference (exact dot products via `reference.nvfp4_mm`, so batch-invariant by
construction). CUDA: the Triton kernels (quantize -> on-grid activations, W4A4 GEMM). Both follow
the same math, written once here:

forward   y = ((dot(q_act(x), W_q)) * gd_x) * gd_w + bias, cast to x.dtype
dgrad     dX = q_grad(dY) @ W_q^T-on-grid   (16x16 tiles: W and W^T quantize identically)
          or BF16: bf16(dY) @ bf16(W master)  (recipe.dgrad)
wgrad     dW = q_grad(dY^T) @ q(X^T)^T, both 1x16 along tokens (padded with zero tokens to a
          multiple of 16), X^T per-tensor RNE; or BF16: bf16(dY)^T @ bf16(X)  (recipe.wgrad)
dbias     sum of dY over tokens, FP32
Stochastic-rounding seeds: dgrad uses `seed`, wgrad `seed + 1` (+ expert index for MoE).
"""

from __future__ import annotations

import torch

from ... import reference as ref
from ...format import BLOCK_SIZE, NVFP4Tensor, pack_codes, unpack_codes

# the CUDA side (gemm_cuda.py) and the shared checks (gemm_operands.py), re-exported: the ops
# and tests call `gemm.<name>` for either device
from .gemm_cuda import (  # noqa: F401
    ONGRID_FORWARD_MIN_ROWS,
    cuda_activation_operands,
    cuda_dgrad,
    cuda_grouped_quantized,
    cuda_linear,
    cuda_linear_quantized,
    cuda_wgrad,
    cuda_wgrad_quantized,
    few_row_parts,
    forward_uses_ongrid,
    gathered_global_scale,
    gathered_row_abs_max,
    grad_amax,
    quantize_transposed_ongrid,
)
from .gemm_operands import (  # noqa: F401
    X_DTYPES,
    act_global,
    check_weight,
    gather_zero_rows,
    no_transposed_operand,
    op_recipe,
    pad_tokens,
    require_packed_bytes,
    weight_nk,
    weight_tensor,
)

# ---------------------------------------------------------------------------------------------
# CPU: the reference


def transpose_tiled(w: NVFP4Tensor) -> NVFP4Tensor:
    """W^T of a 16x16-tiled weight [N, K], as NVFP4 [K, N]: equal to quantize(W^T, 16x16)."""
    n, k = w.shape
    codes_t = pack_codes(unpack_codes(w.codes).transpose(0, 1).contiguous())
    tile = w.block_scales[::BLOCK_SIZE, :]  # [N/16, K/16], one scale per tile
    scales_t = tile.transpose(0, 1).repeat_interleave(BLOCK_SIZE, dim=0).contiguous()
    return NVFP4Tensor(
        codes=codes_t,
        block_scales=scales_t,
        global_decode=w.global_decode,
        shape=(k, n),
        block="16x16",
    )


def cpu_linear(x2, w: NVFP4Tensor, bias, recipe, x_amax):
    xq = ref.quantize(x2, block="1x16", global_scale=act_global(recipe, x_amax), check_finite=False)
    y = ref.nvfp4_mm(xq, w)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x2.dtype)


def q_grad(t, recipe, seed):
    return ref.quantize(
        t,
        block="1x16",
        global_scale=recipe.grad.global_scale,
        rounding=recipe.grad.rounding,
        seed=seed,
        check_finite=False,
    )


def cpu_dgrad(dy2, w: NVFP4Tensor, weight, recipe, seed):
    if recipe.dgrad == "bf16":
        return torch.mm(dy2.to(torch.bfloat16), weight.to(torch.bfloat16)).to(torch.float32)
    return ref.nvfp4_mm(q_grad(dy2, recipe, seed), transpose_tiled(w))


def cpu_wgrad(dy2, x2, recipe, seed):
    if recipe.wgrad == "bf16":
        return torch.mm(dy2.to(torch.bfloat16).t(), x2.to(torch.bfloat16)).to(torch.float32)
    dyt = q_grad(pad_tokens(dy2.t().contiguous()), recipe, seed)
    xt = ref.quantize(
        pad_tokens(x2.t().contiguous()), block="1x16", global_scale="per_tensor", check_finite=False
    )
    return ref.nvfp4_mm(dyt, xt)


# ---------------------------------------------------------------------------------------------
# Pre-quantized activations (`fp4_compile::quantize_activation`, one quantize shared by every GEMM
# reading the same X): the forward and wgrad above, with X's operands given instead of quantized
# here. The same quantizer and the same GEMM calls, so the same bits (the CUDA side: gemm_cuda.py).


def cpu_activation_operands(x2, recipe, x_amax, *, transposed: bool):
    """(x on-grid BF16 [M, K], its global decode ([M, 1] per row, [] per tensor or static),
    X^T on-grid BF16 [K, M16] zero-padded to a multiple of 16 tokens, its per-tensor global
    decode []): the X operands `cpu_linear` and `cpu_wgrad` quantize for themselves, from the
    reference quantizer. Without `transposed` the last two are empty ([0] each)."""
    xq = ref.quantize(x2, block="1x16", global_scale=act_global(recipe, x_amax), check_finite=False)
    if not transposed:
        return xq.on_grid(torch.bfloat16), xq.global_decode, *no_transposed_operand(x2)
    xtq = ref.quantize(
        pad_tokens(x2.t().contiguous()), block="1x16", global_scale="per_tensor", check_finite=False
    )
    return (
        xq.on_grid(torch.bfloat16),
        xq.global_decode,
        xtq.on_grid(torch.bfloat16),
        xtq.global_decode,
    )


def cpu_linear_quantized(x_ongrid, x_gd, w: NVFP4Tensor, bias, out_dtype):
    """`cpu_linear` with x's quantization given (its on-grid values and global decode)."""
    acc = ref.exact_dot_ongrid(x_ongrid, w.on_grid(torch.bfloat16))
    y = ref.apply_global_scales(acc, x_gd, w.global_decode)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)


def cpu_wgrad_quantized(dy2, xt_ongrid, xt_gd, recipe, seed):
    """`cpu_wgrad` (NVFP4) with X^T's quantization given."""
    dyt = q_grad(pad_tokens(dy2.t().contiguous()), recipe, seed)
    acc = ref.exact_dot_ongrid(dyt.on_grid(torch.bfloat16), xt_ongrid)
    return ref.apply_global_scales(acc, dyt.global_decode, xt_gd)


def cpu_grouped_quantized(x_ongrid, x_gd, w: NVFP4Tensor, offsets, x_index=None):
    """The experts' forward (`reference.nvfp4_grouped_mm` of quantize(x) per row) with x's
    per-row quantization given: on-grid rows [M, K] and their global decodes [M, 1]; with
    `x_index` the product's rows are those rows gathered (a zero row where x_index < 0, whose
    global decode is a zero row's). FP32 [T, N]."""
    if x_index is not None:
        zero_gd = ref.global_scales(torch.zeros((), dtype=torch.float32))[1]
        keep = (x_index >= 0).unsqueeze(-1)
        x_ongrid = torch.where(keep, x_ongrid[x_index.clamp(min=0)], 0.0).to(torch.bfloat16)
        x_gd = torch.where(keep, x_gd[x_index.clamp(min=0)], zero_gd)
    ref.check_offsets(offsets, x_ongrid.shape[0], w.shape[0])
    out = torch.empty((x_ongrid.shape[0], w.shape[1]), dtype=torch.float32, device=x_ongrid.device)
    start = 0
    for e, end in enumerate(offsets.cpu().tolist()):
        if end > start:
            w_e = w[e]
            acc = ref.exact_dot_ongrid(x_ongrid[start:end], w_e.on_grid(torch.bfloat16))
            out[start:end] = ref.apply_global_scales(
                acc, x_gd[start:end], w_e.global_decode.reshape(())
            )
        start = end
    return out
