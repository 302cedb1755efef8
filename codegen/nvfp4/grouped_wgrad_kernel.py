"""MoE weight gradient in NVFP4, all experts in one pass: dW_e = q(dY_e^T) @ q(X_e^T)^T.

Shape legend: T tokens sorted by expert, N out-features, K in-features, E experts, C the padded
token columns (every expert's segment padded with zero tokens to a multiple of 16, segments laid
end to end; C = T + 15 E rounded up to 16, a bound known without reading the offsets on the
host).

Bitwise equal to the per-expert loop `gemm.cuda_wgrad(dY[s:t], X[s:t], recipe, seed + 1 + e)`
(the CPU reference's math), by construction:
- quantize: each 16-column block belongs to one segment, so the 1x16 blocks are the loop's
  blocks; the global scale of a segment is the amax over its own tokens (per tensor, or per row
  of dY_e^T); the stochastic-rounding stream of a segment is the one its own [N, width] matrix
  draws (`quantize_kernel.quantize_segments_ongrid`);
- GEMM: the program of (expert e, tile) walks e's segment in BLOCK_K chunks from the segment
  start, with the config the loop's dense launch picks for M = N: the same tiles, zeros where the
  loop's masked loads give zeros, the same MMA sequence (both take the pinned "nvfp4_wgrad"
  config), the same epilogue `(acc * gd_a) * gd_b`.
Launches: one for the layout (`segment_layout_kernel.py`), the amaxes, 2 quantize kernels, 1 GEMM,
against 3 kernels and about 20 torch ops per expert for the loop (and no host read of offsets).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...format import BLOCK_SIZE
from ...sr_stream import DeviceSeed
from ..configs import pick
from ..runtime import arch_of, check_kernel_device, compile_options, interpreting
from .abs_max_kernel import segment_abs_max, segment_column_abs_max
from .gemm import gathered_row_abs_max
from .quantize_kernel import quantize_segments_ongrid
from .segment_layout_kernel import segment_layout


@triton.jit
def _grouped_wgrad_kernel(
    a_ptr,
    b_ptr,
    gda_ptr,
    gdb_ptr,
    out_ptr,
    start_ptr,
    width_ptr,
    N,
    K,
    stride_an,
    stride_bk,
    gda_e,
    gda_r,
    stride_oe,
    stride_on,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SEGMENT_ALIGN: tl.constexpr,
):
    # SEGMENT_ALIGN: every segment start AND width is a multiple of it (16: `segment_layout`
    # pads widths to 16). Said to the compiler, the loads along the token columns become
    # pipelined 16-byte async copies: with the start alone the K-tail mask `kk < width` had
    # unknown granularity and every operand element was its own 2-byte load, with no software
    # pipeline (sm_90 PTX: 0 cp.async and 96-101 ld.global.b16 -> 36 cp.async.cg, 0 scalar;
    # `tools/ptx_audit.py`). Bits: the same masks, the same MMA sequence.
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1).to(tl.int64)
    e = tl.program_id(2).to(tl.int64)
    start = tl.multiple_of(tl.load(start_ptr + e), SEGMENT_ALIGN)
    width = tl.multiple_of(tl.load(width_ptr + e), SEGMENT_ALIGN)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    cmask = cols < K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, width, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        kmask = kk < width
        a = tl.load(
            a_ptr + rows[:, None] * stride_an + (start + kk)[None, :],
            mask=rmask[:, None] & kmask[None, :],
            other=0.0,
        )
        b = tl.load(
            b_ptr + cols[None, :] * stride_bk + (start + kk)[:, None],
            mask=cmask[None, :] & kmask[:, None],
            other=0.0,
        )
        if DOT_F32:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    gda = tl.load(gda_ptr + e * gda_e + rows * gda_r, mask=rmask, other=1.0)
    gdb = tl.load(gdb_ptr + e)
    out = ((acc * gda[:, None]) * gdb).to(out_ptr.dtype.element_ty)
    e64 = e.to(tl.int64)
    tl.store(
        out_ptr + e64 * stride_oe + rows[:, None] * stride_on + cols[None, :],
        out,
        mask=rmask[:, None] & cmask[None, :],
    )


def _segment_amax(t_TD: torch.Tensor, offsets: torch.Tensor, per_row: bool, rows=None):
    """Per-expert amax of |t| over its tokens: [E] (per tensor) or [E, D] (per row of t^T),
    each in one read of t (max is exact in any order and dtype); `rows`: t's row maxima, when
    the caller has them (per tensor: then t is not read here at all)."""
    if per_row:
        return segment_column_abs_max(t_TD, offsets)
    return segment_abs_max(t_TD, offsets, rows)


def grouped_wgrad(
    dy_TN: torch.Tensor,
    x_TK: torch.Tensor,
    offsets: torch.Tensor,
    recipe,
    seed: int | torch.Tensor,
    out_dtype: torch.dtype = torch.float32,
    dy_row_amax: torch.Tensor | None = None,
    x_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """dW [E, N, K] in `out_dtype` of the NVFP4 wgrad (recipe.wgrad == "nvfp4"), expert e
    drawing the stochastic-rounding seed `seed + 1 + e` (as
    `grouped_linear.nvfp4_grouped_mm_backward`). `dy_row_amax`: dY's per-row max |dY|
    (`abs_max_kernel.row_abs_max`) when the caller read it already (the dgrad's per-tensor amax
    comes from the same row maxima)
    The kernel stores `out_dtype` directly: its FP32 epilogue, then one round-to-nearest-even
    cast, the bits of `.to(out_dtype)` of the FP32 result (in the interpreter, whose casts
    truncate, torch casts the FP32 result).
    `x_index` (int [T]): the operand X is x_TK[x_index], a zero row where x_index < 0 (the MoE
    token gather, `gemm.gather_zero_rows`), read through the index by the quantizer:
    bitwise `grouped_wgrad(dy, gather_zero_rows(x_TK, x_index), ...)` without the copy."""
    check_kernel_device(dy_TN, "grad_out")

    if recipe.wgrad != "nvfp4":
        raise ValueError(f"grouped_wgrad is the NVFP4 wgrad; recipe.wgrad={recipe.wgrad!r}")
    mode = recipe.grad.global_scale
    if mode not in ("per_tensor", "per_row"):
        raise ValueError(f"recipe.grad.global_scale={mode!r}: grouped wgrad needs a data amax")
    num_experts = offsets.shape[0]
    (t, n), k = dy_TN.shape, x_TK.shape[1]
    dev = dy_TN.device
    lay = segment_layout(offsets, t, row_index=x_index)
    sr_seed = None
    if recipe.grad.rounding == "stochastic":  # expert e: seed + 1 + e (host or device seed)
        sr_seed = (DeviceSeed(seed) if isinstance(seed, torch.Tensor) else seed) + 1
    seg = (lay["block_group"], lay["start"], lay["width"])
    amax_dy = _segment_amax(dy_TN, offsets, mode == "per_row", dy_row_amax)
    a, gd_a = quantize_segments_ongrid(dy_TN, lay["src"], *seg, amax_dy, seed=sr_seed)
    if x_index is None:
        b, gd_b = quantize_segments_ongrid(
            x_TK, lay["src"], *seg, _segment_amax(x_TK, offsets, False)
        )
    else:  # the gathered rows' maxima: each source row's, read once per source row
        amax_x = _segment_amax(None, offsets, False, gathered_row_abs_max(x_TK, x_index))
        b, gd_b = quantize_segments_ongrid(x_TK, lay["src_rows"], *seg, amax_x)
    cfg = pick(arch_of(dev), "bf16" if dev.type == "cuda" else "fp32", "nvfp4_wgrad", n)
    interp = interpreting() or dev.type != "cuda"
    out = torch.empty((num_experts, n, k), dtype=torch.float32 if interp else out_dtype, device=dev)
    if n and k and num_experts:
        grid = (triton.cdiv(n, cfg.block_m), triton.cdiv(k, cfg.block_n), num_experts)
        _grouped_wgrad_kernel[grid](
            a,
            b,
            gd_a,
            gd_b,
            out,
            lay["start"],
            lay["width"],
            n,
            k,
            a.stride(0),
            b.stride(0),
            gd_a.stride(0),
            1 if gd_a.dim() == 2 else 0,
            out.stride(0),
            out.stride(1),
            DOT_F32=interpreting() or dev.type != "cuda",
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            SEGMENT_ALIGN=BLOCK_SIZE,
            **cfg.launch_kwargs(),
            **compile_options(dev),
        )
    return out.to(out_dtype)
