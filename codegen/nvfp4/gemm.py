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
import torch.nn.functional as F

from ... import reference as ref
from ...format import BLOCK_SIZE, NVFP4Tensor, pack_codes, unpack_codes
from ...recipe import NVFP4Recipe

X_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def op_recipe(numerics: str) -> NVFP4Recipe:
    """The recipe of an NVFP4 op's numerics key (`NVFP4Recipe.from_numerics_key`, cached),
    checked for what the ops support."""
    recipe = NVFP4Recipe.from_numerics_key(numerics)
    if not recipe.quantize:
        raise ValueError("recipe.quantize is False: NVFP4 ops need a quantizing recipe")
    if recipe.grad.global_scale == "static":
        raise ValueError("recipe.grad.global_scale='static' is not supported (no calibrated amax)")
    return recipe


def act_global(recipe: NVFP4Recipe, x_amax: torch.Tensor | None):
    """The activation global-scale argument of `quantize` for this recipe."""
    mode = recipe.activation.global_scale
    if mode == "static":
        if x_amax is None:
            raise ValueError(
                "recipe.activation.global_scale='static' needs x_amax (a float32 scalar)"
            )
        return x_amax.reshape(())
    return mode


def weight_nk(w_codes, w_ongrid) -> tuple[int, int]:
    """(N, K) of a quantized weight: from its packed codes [.., N, K/2], or from its on-grid
    copy [.., N, K] when the codes hold no bytes ([.., N, 0]: quantized on-grid only)."""
    if w_codes.shape[-1] == 0 and w_ongrid is not None:
        return w_ongrid.shape[-2], w_ongrid.shape[-1]
    return w_codes.shape[-2], w_codes.shape[-1] * 2


def require_packed_bytes(w_codes) -> None:
    """Raise unless w_codes holds the packed bytes (paths that decode them)."""
    if w_codes.shape[-1] == 0:
        raise ValueError(
            "w_codes holds no packed bytes (a weight quantized on-grid only): this path reads "
            "the packed weight; quantize it with packed=True"
        )


def check_weight(x, w_codes, w_scales, w_gd, *, experts: bool, w_ongrid=None) -> tuple[int, int]:
    """Validate the quantized weight against x; returns (N, K). Codes and scales may be
    [.., N, 0] (no packed bytes) when w_ongrid, the on-grid copy [.., N, K], is given."""
    if not isinstance(x, torch.Tensor) or x.dtype not in X_DTYPES:
        raise TypeError(
            f"x must be a bfloat16/float32/float16 tensor, got {getattr(x, 'dtype', x)}"
        )
    rank = 3 if experts else 2
    if w_codes.dtype != torch.uint8 or w_codes.dim() != rank:
        raise TypeError(
            f"w_codes must be uint8 of rank {rank}, got {w_codes.dtype}{list(w_codes.shape)}"
        )
    if w_scales.dtype != torch.uint8:
        raise TypeError(f"w_scales must be the E4M3 scale bytes as uint8, got {w_scales.dtype}")
    if w_gd.dtype != torch.float32:
        raise TypeError(f"w_global_decode must be float32, got {w_gd.dtype}")
    if w_codes.shape[-1] == 0:
        if w_ongrid is None:
            raise ValueError(
                "w_codes holds no packed bytes ([.., N, 0]: a weight quantized on-grid only) "
                "and w_ongrid is None: pass the weight's on-grid copy as w_ongrid"
            )
        if w_ongrid.dtype != torch.bfloat16 or w_ongrid.shape[:-1] != w_codes.shape[:-1]:
            raise ValueError(
                f"w_ongrid must be bfloat16 [.., N, K] matching w_codes {tuple(w_codes.shape)}, "
                f"got {w_ongrid.dtype}{list(w_ongrid.shape)}"
            )
    n, k = weight_nk(w_codes, w_ongrid)
    if x.shape[-1] != k:
        raise ValueError(f"x last dim {x.shape[-1]} != weight in-features K={k}")
    want_scales = (*w_codes.shape[:-1], k // BLOCK_SIZE if w_codes.shape[-1] else 0)
    if tuple(w_scales.shape) != want_scales:
        raise ValueError(
            f"w_scales shape {tuple(w_scales.shape)} does not match w_codes {tuple(w_codes.shape)}"
        )
    return n, k


def weight_tensor(w_codes, w_scales, w_gd, n: int, k: int) -> NVFP4Tensor:
    """Rebuild the NVFP4Tensor from the op arguments (w_scales: E4M3 bytes as uint8)."""
    require_packed_bytes(w_codes)
    return NVFP4Tensor(codes=w_codes, block_scales=w_scales.view(torch.float8_e4m3fn), global_decode=w_gd,
                       shape=(*w_codes.shape[:-2], n, k), block="16x16")  # fmt: skip


def transpose_tiled(w: NVFP4Tensor) -> NVFP4Tensor:
    """W^T of a 16x16-tiled weight [N, K], as NVFP4 [K, N]: equal to quantize(W^T, 16x16)."""
    n, k = w.shape
    codes_t = pack_codes(unpack_codes(w.codes).transpose(0, 1).contiguous())
    tile = w.block_scales[::BLOCK_SIZE, :]  # [N/16, K/16], one scale per tile
    scales_t = tile.transpose(0, 1).repeat_interleave(BLOCK_SIZE, dim=0).contiguous()
    return NVFP4Tensor(codes=codes_t, block_scales=scales_t, global_decode=w.global_decode,
                       shape=(k, n), block="16x16")  # fmt: skip


def pad_tokens(t_RM: torch.Tensor) -> torch.Tensor:
    """Pad the last (token) dim with zeros to a multiple of 16 (zeros change no amax, no dot)."""
    pad = (-t_RM.shape[-1]) % BLOCK_SIZE
    return F.pad(t_RM, (0, pad)) if pad else t_RM


# ---------------------------------------------------------------------------------------------
# CPU: the reference


def cpu_linear(x2, w: NVFP4Tensor, bias, recipe, x_amax):
    xq = ref.quantize(x2, block="1x16", global_scale=act_global(recipe, x_amax), check_finite=False)
    y = ref.nvfp4_mm(xq, w)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x2.dtype)


def q_grad(t, recipe, seed):
    return ref.quantize(t, block="1x16", global_scale=recipe.grad.global_scale,
                        rounding=recipe.grad.rounding, seed=seed, check_finite=False)  # fmt: skip


def cpu_dgrad(dy2, w: NVFP4Tensor, weight, recipe, seed):
    if recipe.dgrad == "bf16":
        return torch.mm(dy2.to(torch.bfloat16), weight.to(torch.bfloat16)).to(torch.float32)
    return ref.nvfp4_mm(q_grad(dy2, recipe, seed), transpose_tiled(w))


def cpu_wgrad(dy2, x2, recipe, seed):
    if recipe.wgrad == "bf16":
        return torch.mm(dy2.to(torch.bfloat16).t(), x2.to(torch.bfloat16)).to(torch.float32)
    dyt = q_grad(pad_tokens(dy2.t().contiguous()), recipe, seed)
    xt = ref.quantize(pad_tokens(x2.t().contiguous()), block="1x16", global_scale="per_tensor",
                      check_finite=False)  # fmt: skip
    return ref.nvfp4_mm(dyt, xt)


# ---------------------------------------------------------------------------------------------
# CUDA: the Triton kernels


# Rows per weight (per expert for MoE) from which the forward dequantizes a packed weight once
# into its on-grid BF16 copy and runs the on-grid GEMM: decoding E2M1 x E4M3 in registers is
# ALU-bound and is repeated for every BLOCK_M rows; below this many rows the one dequantize
# costs more than it saves (H200: benchmarks/results/2026-12-02_grouped_gemm.md).
# Packed and on-grid GEMMs give the same bits on CUDA (same operand values, same K order;
# tests/codegen re-checks it on cancellation-heavy rows on both sides of this threshold): the
# rollout's decode (packed, few rows) and the learner (on-grid) stay equal. Not in the Triton
# interpreter, whose FP32 `tl.dot` is numpy's and sums a transposed operand in another order.
ONGRID_FORWARD_MIN_ROWS = 256


def forward_uses_ongrid(device_type: str, rows: int) -> bool:
    """Whether the forward of a weight seeing `rows` rows (per expert for MoE) runs the on-grid
    GEMM (so a lowered graph may dequantize that weight once, `fp4_compile::ongrid_weight`, and
    hand the copy to the forward and the backward alike)."""
    return device_type == "cuda" and rows >= ONGRID_FORWARD_MIN_ROWS


def gather_zero_rows(x2: torch.Tensor, x_index: torch.Tensor) -> torch.Tensor:
    """x2[x_index] with a zero row where x_index < 0 (the grouped ops' `x_index` semantics:
    the experts' token gather, masked rows zeroed), as a copy."""
    rows = x2[x_index.clamp(min=0)]
    return torch.where((x_index >= 0).unsqueeze(-1), rows, torch.zeros((), dtype=x2.dtype,
                                                                      device=x2.device))  # fmt: skip


def gathered_row_abs_max(x2, x_index):
    """max |row| of each row of `gather_zero_rows(x2, x_index)` (FP32), from one read of x2's
    rows (a gathered row's max is its source row's; a zero row's is 0)."""
    from .abs_max_kernel import row_abs_max

    rows = row_abs_max(x2)[x_index.clamp(min=0)]
    return torch.where(x_index >= 0, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


def gathered_global_scale(x2, x_index, recipe, x_amax):
    """The activation global-scale argument of `quantize` for the rows
    `gather_zero_rows(x2, x_index)`, when x2 itself is what gets quantized (per row: the rows'
    own scales; per tensor: the amax of the gathered rows only, from x2's row maxima, exact:
    max is a per-row then any-order max)."""
    gs = act_global(recipe, x_amax)
    if isinstance(gs, str) and gs == "per_tensor":
        if x_index.numel() == 0:
            return torch.zeros((), dtype=torch.float32, device=x2.device)
        from .abs_max_kernel import vector_abs_max

        return vector_abs_max(gathered_row_abs_max(x2, x_index))
    return gs


def cuda_linear(x2, w_codes, w_scales, w_gd, w_ongrid, bias, recipe, x_amax, offsets=None,
                x_index=None):  # fmt: skip
    """The forward GEMM. `x_index` (MoE): the product's rows are x2[x_index] (a zero row where
    x_index < 0: `gather_zero_rows`); x2 is quantized
    once per row (1x16 blocks are row-local, so a gathered row's quantization is its source
    row's) and the GEMM gathers the on-grid rows in its operand load: bitwise
    `cuda_linear(x2[x_index], ...)` without the gathered copy or quantizing each token top-k
    times."""
    from .gemm_kernel import launch_gemm, ongrid_weight
    from .quantize_kernel import quantize_triton

    gs = act_global(recipe, x_amax) if x_index is None else gathered_global_scale(
        x2, x_index, recipe, x_amax)  # fmt: skip
    a, gd_a = quantize_triton(x2, block="1x16", global_scale=gs, out="ongrid")
    m = x2.shape[0] if x_index is None else x_index.shape[0]
    rows = m if offsets is None else max(1, -(-m // w_codes.shape[0]))
    if w_ongrid is None and forward_uses_ongrid(x2.device.type, rows):
        w_ongrid = ongrid_weight(w_codes, w_scales)
    b = w_ongrid if w_ongrid is not None else (w_codes, w_scales)
    return launch_gemm(a, gd_a, b, w_gd, bias=bias, out_dtype=x2.dtype, offsets=offsets,
                       rows_per_group=rows, a_rows=x_index)  # fmt: skip


def _ongrid_weight(w_codes, w_scales, w_gd, w_ongrid, n, k):
    from .gemm_kernel import ongrid_weight

    if w_ongrid is not None:
        return w_ongrid
    return ongrid_weight(w_codes, w_scales)


def grad_amax(dy2, recipe):
    """The gradient's per-tensor amax (FP32 []) when the recipe scales it per tensor, else None:
    dgrad and wgrad quantize the same dY (along N and along T), so one read serves both."""
    if recipe.grad.global_scale != "per_tensor":
        return None
    from .abs_max_kernel import tensor_abs_max

    return tensor_abs_max(dy2)


def cuda_dgrad(dy2, w_codes, w_scales, w_gd, w_ongrid, weight, recipe, seed, offsets=None, *,
               out_dtype=torch.float32, dy_amax=None):  # fmt: skip
    """dX [T, K] in `out_dtype`: the GEMM stores it directly (its FP32 epilogue, then one
    round-to-nearest-even cast, as `.to(out_dtype)` would). `dy_amax`: dY's per-tensor amax
    when the caller has it (`grad_amax`)."""
    from .gemm_kernel import launch_gemm
    from .quantize_kernel import quantize_triton

    n, k = weight_nk(w_codes, w_ongrid)
    if recipe.dgrad == "bf16":
        if offsets is not None:
            raise NotImplementedError("grouped dgrad in bf16 is done per expert by the caller")
        return torch.mm(dy2.to(torch.bfloat16), weight.to(torch.bfloat16)).to(out_dtype)
    scale = recipe.grad.global_scale if dy_amax is None else dy_amax
    a, gd_a = quantize_triton(dy2, block="1x16", global_scale=scale,
                              rounding=recipe.grad.rounding, seed=seed, out="ongrid")  # fmt: skip
    w_t = _ongrid_weight(w_codes, w_scales, w_gd, w_ongrid, n, k).transpose(-1, -2)  # view
    rows = None if offsets is None else max(1, -(-dy2.shape[0] // w_codes.shape[0]))
    return launch_gemm(a, gd_a, w_t, w_gd, out_dtype=out_dtype, offsets=offsets,
                       rows_per_group=rows)  # fmt: skip


def quantize_transposed_ongrid(t_TD, *, global_scale, rounding="rne", seed=None):
    """1x16 on-grid quantize of t^T zero-padded to a multiple of 16 tokens, [D, T16], and its
    global decode ([] per tensor, [D, 1] per row): bitwise `quantize_triton(pad_tokens(
    t.t().contiguous()), ...)`, without writing the transposed copy (the segmented quantizer
    reads t strided, as ONE segment: `grouped_wgrad`'s path with one expert, its layout derived
    in the kernel).
    global_scale: "per_tensor", "per_row", or the FP32 amax [] of t; seed an int or an int64
    [1] device tensor or `sr_stream.DeviceSeed` (stochastic rounding)."""
    from .quantize_kernel import quantize_tokens_transposed_ongrid

    d = t_TD.shape[1]
    per_row = isinstance(global_scale, str) and global_scale == "per_row"
    if isinstance(global_scale, torch.Tensor):
        amax = global_scale.reshape(1).to(torch.float32)
    elif per_row:  # of t^T's rows: max over tokens, exact in any order
        amax = t_TD.abs().amax(dim=0).to(torch.float32).reshape(1, d)
    elif global_scale == "per_tensor":
        from .abs_max_kernel import tensor_abs_max

        amax = tensor_abs_max(t_TD).reshape(1)
    else:
        raise ValueError(
            f"global_scale must be 'per_tensor', 'per_row' or an amax, got {global_scale!r}"
        )
    if rounding == "stochastic" and seed is None:
        raise ValueError("rounding='stochastic' needs a seed")
    ongrid, gd = quantize_tokens_transposed_ongrid(
        t_TD, amax, seed=seed if rounding == "stochastic" else None
    )
    return ongrid, (gd.reshape(d, 1) if per_row else gd.reshape(()))


def cuda_wgrad(dy2, x2, recipe, seed, *, out_dtype=torch.float32, dy_amax=None):
    """dW [N, K] in `out_dtype` (stored directly by the GEMM, as in cuda_dgrad). dY^T and X^T
    are quantized straight from dY and X (no transposed copies)."""
    from .gemm_kernel import launch_gemm

    if recipe.wgrad == "bf16":
        return torch.mm(dy2.to(torch.bfloat16).t(), x2.to(torch.bfloat16)).to(out_dtype)
    scale = recipe.grad.global_scale if dy_amax is None else dy_amax  # zero padding: same amax
    a, gd_a = quantize_transposed_ongrid(dy2, global_scale=scale,
                                         rounding=recipe.grad.rounding, seed=seed)  # fmt: skip
    b, gd_b = quantize_transposed_ongrid(x2, global_scale="per_tensor")
    return launch_gemm(a, gd_a, b, gd_b, out_dtype=out_dtype, config_op="nvfp4_wgrad")


# ---------------------------------------------------------------------------------------------
# Pre-quantized activations (`fp4_compile::quantize_activation`, one quantize shared by every GEMM
# reading the same X): the forward and wgrad above, with X's operands given instead of quantized
# here. The same quantizer and the same GEMM calls, so the same bits.


def cpu_activation_operands(x2, recipe, x_amax, *, transposed: bool):
    """(x on-grid BF16 [M, K], its global decode ([M, 1] per row, [] per tensor or static),
    X^T on-grid BF16 [K, M16] zero-padded to a multiple of 16 tokens, its per-tensor global
    decode []): the X operands `cpu_linear` and `cpu_wgrad` quantize for themselves, from the
    reference quantizer. Without `transposed` the last two are empty ([0] each)."""
    xq = ref.quantize(x2, block="1x16", global_scale=act_global(recipe, x_amax), check_finite=False)
    if not transposed:
        return xq.on_grid(torch.bfloat16), xq.global_decode, *no_transposed_operand(x2)
    xtq = ref.quantize(pad_tokens(x2.t().contiguous()), block="1x16", global_scale="per_tensor",
                       check_finite=False)  # fmt: skip
    return (
        xq.on_grid(torch.bfloat16),
        xq.global_decode,
        xtq.on_grid(torch.bfloat16),
        xtq.global_decode,
    )


def cuda_activation_operands(x2, recipe, x_amax, *, transposed: bool):
    """`cpu_activation_operands` from the Triton kernels: the operands `cuda_linear` and
    `cuda_wgrad` quantize for themselves, by the same calls."""
    from .quantize_kernel import quantize_triton

    gs = act_global(recipe, x_amax)
    a, gd_a = quantize_triton(x2, block="1x16", global_scale=gs, out="ongrid")
    if not transposed:
        return a, gd_a, *no_transposed_operand(x2)
    return a, gd_a, *quantize_transposed_ongrid(x2, global_scale="per_tensor")


def no_transposed_operand(x2):
    """The (X^T on-grid, global decode) pair of a graph that quantizes no X^T: [0] each."""
    return x2.new_empty((0,), dtype=torch.bfloat16), x2.new_empty((0,), dtype=torch.float32)


def cpu_linear_quantized(x_ongrid, x_gd, w: NVFP4Tensor, bias, out_dtype):
    """`cpu_linear` with x's quantization given (its on-grid values and global decode)."""
    acc = ref.exact_dot_ongrid(x_ongrid, w.on_grid(torch.bfloat16))
    y = ref.apply_global_scales(acc, x_gd, w.global_decode)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)


def cuda_linear_quantized(x_ongrid, x_gd, w_codes, w_scales, w_gd, w_ongrid, bias, out_dtype):
    """`cuda_linear` (x_index None) with x's quantization given: the same GEMM launch."""
    from .gemm_kernel import launch_gemm, ongrid_weight

    rows = x_ongrid.shape[0]
    if w_ongrid is None and forward_uses_ongrid(x_ongrid.device.type, rows):
        w_ongrid = ongrid_weight(w_codes, w_scales)
    b = w_ongrid if w_ongrid is not None else (w_codes, w_scales)
    return launch_gemm(x_ongrid, x_gd, b, w_gd, bias=bias, out_dtype=out_dtype,
                       rows_per_group=rows)  # fmt: skip


def cpu_wgrad_quantized(dy2, xt_ongrid, xt_gd, recipe, seed):
    """`cpu_wgrad` (NVFP4) with X^T's quantization given."""
    dyt = q_grad(pad_tokens(dy2.t().contiguous()), recipe, seed)
    acc = ref.exact_dot_ongrid(dyt.on_grid(torch.bfloat16), xt_ongrid)
    return ref.apply_global_scales(acc, dyt.global_decode, xt_gd)


def cuda_wgrad_quantized(dy2, xt_ongrid, xt_gd, recipe, seed, *, out_dtype, dy_amax=None):
    """`cuda_wgrad` (NVFP4) with X^T's quantization given: the same GEMM launch."""
    from .gemm_kernel import launch_gemm

    scale = recipe.grad.global_scale if dy_amax is None else dy_amax
    a, gd_a = quantize_transposed_ongrid(dy2, global_scale=scale,
                                         rounding=recipe.grad.rounding, seed=seed)  # fmt: skip
    return launch_gemm(a, gd_a, xt_ongrid, xt_gd, out_dtype=out_dtype, config_op="nvfp4_wgrad")


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
            out[start:end] = ref.apply_global_scales(acc, x_gd[start:end],
                                                     w_e.global_decode.reshape(()))  # fmt: skip
        start = end
    return out


def cuda_grouped_quantized(x_ongrid, x_gd, w_codes, w_scales, w_gd, w_ongrid, offsets, out_dtype,
                           x_index=None):  # fmt: skip
    """`cuda_linear` with offsets (and x_index) given x's per-row quantization: the same GEMM
    launch."""
    from .gemm_kernel import launch_gemm, ongrid_weight

    m = x_ongrid.shape[0] if x_index is None else x_index.shape[0]
    rows = max(1, -(-m // w_codes.shape[0]))
    if w_ongrid is None and forward_uses_ongrid(x_ongrid.device.type, rows):
        w_ongrid = ongrid_weight(w_codes, w_scales)
    b = w_ongrid if w_ongrid is not None else (w_codes, w_scales)
    return launch_gemm(x_ongrid, x_gd, b, w_gd, out_dtype=out_dtype, offsets=offsets,
                       rows_per_group=rows, a_rows=x_index)  # fmt: skip
