"""The forward activations' NVFP4 quantize (1x16 blocks, one global scale per row, RNE, on-grid
values) in ONE launch: each program owns whole rows, takes their amax in a first pass over K and
quantizes them in a second, whose reads of the same rows come from L2.

The two-step form (`quantize_global.row_global_stage`, then `quantize_kernel._quantize_kernel`)
reads every activation from HBM twice and launches twice per GEMM input (12 pairs per H200
learner step: the q / k / v / o inputs and both expert GEMMs' of two layers, 0.12 ms of
`_row_global_kernel` alone at 03b48de). Bitwise that form: the amax loop is
`abs_max.row_abs_max_nan`, the scales `quantize_global._scales_from_amax`, the block encode,
rounding and on-grid value `quantize_kernel`'s helpers, each element computed by the same
operations in the same order (tests/codegen/test_row_quantize.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .abs_max import row_abs_max_nan
from .configs import pick
from .quantize_global import _scales_from_amax
from .quantize_kernel import (
    _ONE_SIXTH_F32,
    _block_encode,
    _rne_ongrid_magnitude,
    _signed_value,
)
from .runtime import arch_of, check_kernel_device, compile_options


@triton.jit
def _row_quantize_kernel(x_ptr, gd_ptr, ongrid_ptr, R, K, stride_xr, one_sixth,
                         BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    NB: tl.constexpr = BLOCK_K // 16
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < R
    amax, nan = row_abs_max_nan(x_ptr, rows, rmask, K, stride_xr, BLOCK_M, BLOCK_K)
    gd1, mult1 = _scales_from_amax(amax, nan > 0, one_sixth, BLOCK_M)
    tl.store(gd_ptr + rows, gd1, mask=rmask)
    gd = gd1[:, None]
    mult = mult1[:, None]
    rows3 = rows[:, None, None]
    for k0 in range(0, K, BLOCK_K):
        cols3 = k0 + tl.arange(0, NB)[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
        mask = (rows3 < R) & (cols3 < K)
        x = tl.load(x_ptr + rows3 * stride_xr + cols3, mask=mask, other=0.0).to(tl.float32)
        vmax = tl.max(tl.abs(x), axis=2)  # [BM, NB]
        s_code, s_val, enc = _block_encode(vmax, mult, gd)
        v = tl.minimum(tl.maximum(x * enc[:, :, None], -6.0), 6.0)
        val = _signed_value(_rne_ongrid_magnitude(tl.abs(v)), v, s_val)
        tl.store(ongrid_ptr + rows3 * K + cols3, val.to(ongrid_ptr.dtype.element_ty), mask=mask)


def quantize_rows_ongrid(x2: torch.Tensor, ongrid_dtype: torch.dtype = torch.bfloat16):
    """x2 [R, K] (K a multiple of 16, unit stride along K) -> (on-grid values [R, K] in
    `ongrid_dtype`, global decode FP32 [R, 1]): bitwise `quantize_triton(x2, block="1x16",
    global_scale="per_row", rounding="rne", out="ongrid")`'s two launches, in one."""
    check_kernel_device(x2, "x")
    if x2.dim() != 2 or x2.shape[1] % 16 or (x2.shape[1] > 1 and x2.stride(1) != 1):
        raise ValueError(f"x must be [R, K] with K a multiple of 16 and a unit stride along K, "
                         f"got {tuple(x2.shape)} strides {x2.stride()}")  # fmt: skip
    if x2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x2.dtype}")
    r, k = x2.shape
    gd = torch.empty((r, 1), dtype=torch.float32, device=x2.device)
    ongrid = torch.empty((r, k), dtype=ongrid_dtype, device=x2.device)
    cfg = pick(arch_of(x2.device), "any", "nvfp4_quantize_rows", r)
    if r:  # K = 0 too: the scales of an all-zero row
        _row_quantize_kernel[(triton.cdiv(r, cfg.block_m),)](
            x2, gd, ongrid, r, k, x2.stride(0), _ONE_SIXTH_F32,
            BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
            **cfg.launch_kwargs(), **compile_options(x2.device),
        )  # fmt: skip
    return ongrid, gd
