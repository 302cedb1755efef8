"""The CUDA side of the NVFP4 GEMM ops: quantize the operands and launch the Triton GEMMs
(`gemm_kernel.py`), following the math written out in `gemm.py` (the CPU reference).

Shape legend: M tokens (x's leading dims flattened), T tokens sorted by expert, K in-features,
N out-features, E experts.
"""

from __future__ import annotations

import torch

from ..configs import decode_dispatch, pick_launch
from ..runtime import kernel_target
from .gemm_operands import act_global, no_transposed_operand, weight_nk

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


def gathered_row_abs_max(x2, x_index):
    """max |row| of each row of `gather_zero_rows(x2, x_index)` (FP32), from one read of x2's
    rows (a gathered row's max is its source row's; a zero row's is 0)."""
    from .abs_max_kernel import row_abs_max  # lazy: imports triton

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
        from .abs_max_kernel import vector_abs_max  # lazy: imports triton

        return vector_abs_max(gathered_row_abs_max(x2, x_index))
    return gs


def few_row_parts(x2, gs, b, rows, given=None):
    """The chunk maxima of x2 [M_a, K] (`abs_max_kernel.chunk_abs_max`) where the forward of
    rows `rows` per weight quantizes x2 per row in `quantize_triton`'s split form (chunk maxima,
    then `row_codes`) and `launch_gemm` sends the packed GEMM to the decode kernel; else None.
    The decode kernel then quantizes x2 in its prologue with row_codes' own code
    (`decode_gemm_prologue.py`): the same on-grid operand and global decodes, bitwise, and no
    row_codes launch. `given`: x2's partial row maxima FP32 [M_a, P] from its producer (any
    split of each row: the prologue folds them with a max, exact in any grouping), returned
    instead of launching chunk_abs_max."""
    from .abs_max_kernel import chunk_abs_max  # lazy: imports triton

    target = kernel_target(x2)
    per_row = isinstance(gs, str) and gs == "per_row"
    if not (per_row and isinstance(b, tuple) and x2.numel() and x2.stride(-1) == 1):
        return None
    few = x2.shape[0] < pick_launch(target.arch, "row_quantize")["split_rows_below"]
    if not few or decode_dispatch(target.arch, rows) is None:
        return None
    return given if given is not None else chunk_abs_max(x2, target=target)


def cuda_linear(
    x2,
    w_codes,
    w_scales,
    w_gd,
    w_ongrid,
    bias,
    recipe,
    x_amax,
    offsets=None,
    x_index=None,
    x_parts=None,
):
    """The forward GEMM. `x_index` (MoE): the product's rows are x2[x_index] (a zero row where
    x_index < 0: `gather_zero_rows`); x2 is quantized
    once per row (1x16 blocks are row-local, so a gathered row's quantization is its source
    row's) and the GEMM gathers the on-grid rows in its operand load: bitwise
    `cuda_linear(x2[x_index], ...)` without the gathered copy or quantizing each token top-k
    times. `x_parts` (dense): x2's partial row maxima from its producer (`few_row_parts`' given).
    """
    from .gemm_kernel import launch_gemm  # lazy: imports triton
    from .ongrid_weight_kernel import ongrid_weight  # lazy: imports triton
    from .quantize_kernel import quantize_triton  # lazy: imports triton

    gs = (
        act_global(recipe, x_amax)
        if x_index is None
        else gathered_global_scale(x2, x_index, recipe, x_amax)
    )
    m = x2.shape[0] if x_index is None else x_index.shape[0]
    rows = m if offsets is None else max(1, -(-m // w_codes.shape[0]))
    if w_ongrid is None and forward_uses_ongrid(x2.device.type, rows):
        w_ongrid = ongrid_weight(w_codes, w_scales)
    b = w_ongrid if w_ongrid is not None else (w_codes, w_scales)
    parts = few_row_parts(x2, gs, b, rows, x_parts)
    if parts is not None:  # one launch fewer, the same bits (`few_row_parts`)
        from .decode_gemm_kernel import launch_decode_gemm  # lazy: imports triton

        return launch_decode_gemm(
            x2,
            None,
            b,
            w_gd,
            bias=bias,
            out_dtype=x2.dtype,
            offsets=offsets,
            rows_per_group=rows,
            a_rows=x_index,
            a_parts=parts,
        )
    a, gd_a = quantize_triton(x2, block="1x16", global_scale=gs, out="ongrid")
    return launch_gemm(
        a,
        gd_a,
        b,
        w_gd,
        bias=bias,
        out_dtype=x2.dtype,
        offsets=offsets,
        rows_per_group=rows,
        a_rows=x_index,
    )


def _ongrid_weight(w_codes, w_scales, w_gd, w_ongrid, n, k):
    from .ongrid_weight_kernel import ongrid_weight  # lazy: imports triton

    if w_ongrid is not None:
        return w_ongrid
    return ongrid_weight(w_codes, w_scales)


def grad_amax(dy2, recipe):
    """The gradient's per-tensor amax (FP32 []) when the recipe scales it per tensor, else None:
    dgrad and wgrad quantize the same dY (along N and along T), so one read serves both."""
    if recipe.grad.global_scale != "per_tensor":
        return None
    from .abs_max_kernel import tensor_abs_max  # lazy: imports triton

    return tensor_abs_max(dy2)


def cuda_dgrad(
    dy2,
    w_codes,
    w_scales,
    w_gd,
    w_ongrid,
    weight,
    recipe,
    seed,
    offsets=None,
    *,
    out_dtype=torch.float32,
    dy_amax=None,
):
    """dX [T, K] in `out_dtype`: the GEMM stores it directly (its FP32 epilogue, then one
    round-to-nearest-even cast, as `.to(out_dtype)` would). `dy_amax`: dY's per-tensor amax
    when the caller has it (`grad_amax`)."""
    from .gemm_kernel import launch_gemm  # lazy: imports triton
    from .quantize_kernel import quantize_triton  # lazy: imports triton

    n, k = weight_nk(w_codes, w_ongrid)
    if recipe.dgrad == "bf16":
        if offsets is not None:
            raise NotImplementedError("grouped dgrad in bf16 is done per expert by the caller")
        return torch.mm(dy2.to(torch.bfloat16), weight.to(torch.bfloat16)).to(out_dtype)
    scale = recipe.grad.global_scale if dy_amax is None else dy_amax
    a, gd_a = quantize_triton(
        dy2,
        block="1x16",
        global_scale=scale,
        rounding=recipe.grad.rounding,
        seed=seed,
        out="ongrid",
    )
    w_t = _ongrid_weight(w_codes, w_scales, w_gd, w_ongrid, n, k).transpose(-1, -2)  # view
    rows = None if offsets is None else max(1, -(-dy2.shape[0] // w_codes.shape[0]))
    return launch_gemm(
        a, gd_a, w_t, w_gd, out_dtype=out_dtype, offsets=offsets, rows_per_group=rows
    )


def quantize_transposed_ongrid(t_TD, *, global_scale, rounding="rne", seed=None):
    """1x16 on-grid quantize of t^T zero-padded to a multiple of 16 tokens, [D, T16], and its
    global decode ([] per tensor, [D, 1] per row): bitwise `quantize_triton(pad_tokens(
    t.t().contiguous()), ...)`, without writing the transposed copy (the segmented quantizer
    reads t strided, as ONE segment: `grouped_wgrad`'s path with one expert, its layout derived
    in the kernel).
    global_scale: "per_tensor", "per_row", or the FP32 amax [] of t; seed an int or an int64
    [1] device tensor or `sr_stream.DeviceSeed` (stochastic rounding)."""
    from .quantize_kernel import quantize_tokens_transposed_ongrid  # lazy: imports triton

    d = t_TD.shape[1]
    per_row = isinstance(global_scale, str) and global_scale == "per_row"
    if isinstance(global_scale, torch.Tensor):
        amax = global_scale.reshape(1).to(torch.float32)
    elif per_row:  # of t^T's rows: max over tokens, exact in any order
        amax = t_TD.abs().amax(dim=0).to(torch.float32).reshape(1, d)
    elif global_scale == "per_tensor":
        from .abs_max_kernel import tensor_abs_max  # lazy: imports triton

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
    from .gemm_kernel import launch_gemm  # lazy: imports triton

    if recipe.wgrad == "bf16":
        return torch.mm(dy2.to(torch.bfloat16).t(), x2.to(torch.bfloat16)).to(out_dtype)
    scale = recipe.grad.global_scale if dy_amax is None else dy_amax  # zero padding: same amax
    a, gd_a = quantize_transposed_ongrid(
        dy2, global_scale=scale, rounding=recipe.grad.rounding, seed=seed
    )
    b, gd_b = quantize_transposed_ongrid(x2, global_scale="per_tensor")
    return launch_gemm(a, gd_a, b, gd_b, out_dtype=out_dtype, config_op="nvfp4_wgrad")


def cuda_activation_operands(x2, recipe, x_amax, *, transposed: bool):
    """`cpu_activation_operands` from the Triton kernels: the operands `cuda_linear` and
    `cuda_wgrad` quantize for themselves, by the same calls."""
    from .quantize_kernel import quantize_triton  # lazy: imports triton

    gs = act_global(recipe, x_amax)
    a, gd_a = quantize_triton(x2, block="1x16", global_scale=gs, out="ongrid")
    if not transposed:
        return a, gd_a, *no_transposed_operand(x2)
    return a, gd_a, *quantize_transposed_ongrid(x2, global_scale="per_tensor")


def cuda_linear_quantized(x_ongrid, x_gd, w_codes, w_scales, w_gd, w_ongrid, bias, out_dtype):
    """`cuda_linear` (x_index None) with x's quantization given: the same GEMM launch."""
    from .gemm_kernel import launch_gemm  # lazy: imports triton
    from .ongrid_weight_kernel import ongrid_weight  # lazy: imports triton

    rows = x_ongrid.shape[0]
    if w_ongrid is None and forward_uses_ongrid(x_ongrid.device.type, rows):
        w_ongrid = ongrid_weight(w_codes, w_scales)
    b = w_ongrid if w_ongrid is not None else (w_codes, w_scales)
    return launch_gemm(x_ongrid, x_gd, b, w_gd, bias=bias, out_dtype=out_dtype, rows_per_group=rows)


def cuda_wgrad_quantized(dy2, xt_ongrid, xt_gd, recipe, seed, *, out_dtype, dy_amax=None):
    """`cuda_wgrad` (NVFP4) with X^T's quantization given: the same GEMM launch."""
    from .gemm_kernel import launch_gemm  # lazy: imports triton

    scale = recipe.grad.global_scale if dy_amax is None else dy_amax
    a, gd_a = quantize_transposed_ongrid(
        dy2, global_scale=scale, rounding=recipe.grad.rounding, seed=seed
    )
    return launch_gemm(a, gd_a, xt_ongrid, xt_gd, out_dtype=out_dtype, config_op="nvfp4_wgrad")


def cuda_grouped_quantized(
    x_ongrid, x_gd, w_codes, w_scales, w_gd, w_ongrid, offsets, out_dtype, x_index=None
):
    """`cuda_linear` with offsets (and x_index) given x's per-row quantization: the same GEMM
    launch."""
    from .gemm_kernel import launch_gemm  # lazy: imports triton
    from .ongrid_weight_kernel import ongrid_weight  # lazy: imports triton

    m = x_ongrid.shape[0] if x_index is None else x_index.shape[0]
    rows = max(1, -(-m // w_codes.shape[0]))
    if w_ongrid is None and forward_uses_ongrid(x_ongrid.device.type, rows):
        w_ongrid = ongrid_weight(w_codes, w_scales)
    b = w_ongrid if w_ongrid is not None else (w_codes, w_scales)
    return launch_gemm(
        x_ongrid,
        x_gd,
        b,
        w_gd,
        out_dtype=out_dtype,
        offsets=offsets,
        rows_per_group=rows,
        a_rows=x_index,
    )
