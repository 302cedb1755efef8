"""The per-row global stage of the quantizer (steps 1-4 of `reference.quantize`) in ONE Triton
launch: per row amax = max |x|, then global_encode, global_decode and the block-scale multiplier.

In torch those steps are about nine launches (abs, amax, cast, full, divide, clamp, where, divide,
multiply) per quantize call; on the H200 they were most of the host time of a decode-size NVFP4
linear. Steps 1-2 of the scale chain that `quantize_kernel.quantize_triton` runs; bitwise the
torch ops of `reference.quantize`'s global stage:
- max is exact in any order, and |x| of a BF16/FP16/FP32 value is exact in FP32;
- enc = min(2688 / amax, FLT_MAX) with an IEEE-rounded division (amax 0 -> inf -> FLT_MAX),
  enc 0 (amax inf) -> 1, gd = 1 / enc (IEEE division), mult = enc * fp32(1/6): one rounding each,
  exactly the torch ops' roundings;
- a NaN anywhere in a row makes that row's amax, gd and mult NaN, as torch's amax does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import KernelTarget, kernel_target
from ..triton_helpers import ONE_SIXTH_F32, scales_from_amax
from .abs_max_kernel import row_abs_max_nan

# The amax loop and its tiling are abs_max's (max is exact in any order: no bit can change).


@triton.jit
def _amax_global_kernel(amax_ptr, gd_ptr, mult_ptr, n, one_sixth, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    amax = tl.load(amax_ptr + i, mask=live, other=1.0)
    gd, mult = scales_from_amax(amax, amax != amax, one_sixth, BLOCK)
    tl.store(gd_ptr + i, gd, mask=live)
    tl.store(mult_ptr + i, mult, mask=live)


def amax_global_stage(amax: torch.Tensor, *, target: KernelTarget | None = None):
    """FP32 amax (any shape) -> (global_decode, multiplier) of the same shape in ONE launch,
    bitwise `reference.global_scales` (about seven torch launches otherwise). `target` (here
    and below): the caller's `runtime.kernel_target` (looked up here without one)."""
    if amax.dtype != torch.float32:
        raise TypeError(f"amax must be float32, got {amax.dtype}")
    flat = amax.reshape(-1).contiguous()
    gd = torch.empty_like(flat)
    mult = torch.empty_like(flat)
    if flat.numel():
        target = target or kernel_target(amax)
        lc = pick_launch(target.arch, "amax_global")
        _amax_global_kernel[(triton.cdiv(flat.numel(), lc["block"]),)](
            flat,
            gd,
            mult,
            flat.numel(),
            ONE_SIXTH_F32,
            BLOCK=lc["block"],
            **warps_kwargs(lc),
            **target.options,
        )
    return gd.reshape(amax.shape), mult.reshape(amax.shape)


@triton.jit
def _row_global_kernel(
    x_ptr,
    gd_ptr,
    mult_ptr,
    R,
    K,
    stride_xr,
    one_sixth,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    amax, nan = row_abs_max_nan(x_ptr, rows, rmask, K, stride_xr, BLOCK_R, BLOCK_K)
    gd, mult = scales_from_amax(amax, nan > 0, one_sixth, BLOCK_R)
    tl.store(gd_ptr + rows, gd, mask=rmask)
    tl.store(mult_ptr + rows, mult, mask=rmask)


def row_global_stage(x2: torch.Tensor, *, target: KernelTarget | None = None):
    """x2 [R, K] (unit stride along K) -> (global_decode [R], multiplier [R]), FP32."""
    if x2.dim() != 2 or (x2.shape[1] > 1 and x2.stride(1) != 1):
        raise ValueError(f"x2 must be [R, K] with a unit stride along K, got {tuple(x2.shape)}")
    r, k = x2.shape
    gd = torch.empty(r, dtype=torch.float32, device=x2.device)
    mult = torch.empty(r, dtype=torch.float32, device=x2.device)
    target = target or kernel_target(x2)
    lc = pick_launch(target.arch, "row_abs_max")  # the tiling of `row_abs_max`: one read of x
    if r:
        _row_global_kernel[(triton.cdiv(r, lc["block_r"]),)](
            x2,
            gd,
            mult,
            r,
            k,
            x2.stride(0),
            ONE_SIXTH_F32,
            BLOCK_R=lc["block_r"],
            BLOCK_K=lc["block_k"],
            **warps_kwargs(lc),
            **target.options,
        )
    return gd, mult


@triton.jit
def _expert_global_kernel(
    rows_ptr, gd_ptr, mult_ptr, gd_rows_ptr, mult_rows_ptr, N, one_sixth, BLOCK: tl.constexpr
):
    e = tl.program_id(0).to(tl.int64)
    base = e.to(tl.int64) * N
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    nan = tl.zeros((BLOCK,), dtype=tl.int32)
    for i0 in range(0, N, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        v = tl.load(rows_ptr + base + i, mask=i < N, other=0.0)
        amax = tl.maximum(amax, v)
        nan = tl.maximum(nan, (v != v).to(tl.int32))
    amax1 = tl.full((1,), 0.0, tl.float32) + tl.max(amax, axis=0)  # maxima are >= +0.0
    nan1 = tl.full((1,), 0, tl.int32) + tl.max(nan, axis=0)
    gd1, mult1 = scales_from_amax(amax1, nan1 > 0, one_sixth, 1)
    one = tl.arange(0, 1)
    tl.store(gd_ptr + e + one, gd1)
    tl.store(mult_ptr + e + one, mult1)
    gd_b = tl.broadcast_to(gd1, (BLOCK,))
    mult_b = tl.broadcast_to(mult1, (BLOCK,))
    for i0 in range(0, N, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        tl.store(gd_rows_ptr + base + i, gd_b, mask=i < N)
        tl.store(mult_rows_ptr + base + i, mult_b, mask=i < N)


def expert_global_stage(
    row_amax: torch.Tensor, experts: int, *, target: KernelTarget | None = None
):
    """Row maxima of stacked expert weights (FP32 [E * N], `abs_max_kernel.row_abs_max` of [E * N, K])
    -> (global decode [E], multiplier [E], both repeated per row [E * N]) in ONE launch:
    each expert's amax (the max of its rows' maxima, NaN if one is NaN, as torch's amax), then
    `scales_from_amax`. Replaces a torch max reduce, the scale launch and the two copies that
    expanded the per-expert scales to the quantize kernel's per-row operands."""
    if row_amax.dim() != 1 or row_amax.dtype != torch.float32 or row_amax.numel() % experts:
        raise ValueError(
            f"row_amax must be FP32 [E * N] for E={experts}, got "
            f"{row_amax.dtype}{list(row_amax.shape)}"
        )
    n = row_amax.numel() // experts
    dev = row_amax.device
    gd, mult = (torch.empty(experts, dtype=torch.float32, device=dev) for _ in range(2))
    gd_rows, mult_rows = (torch.empty_like(row_amax) for _ in range(2))
    if experts and n:
        target = target or kernel_target(row_amax)
        lc = pick_launch(target.arch, "expert_global")
        _expert_global_kernel[(experts,)](
            row_amax.contiguous(),
            gd,
            mult,
            gd_rows,
            mult_rows,
            n,
            ONE_SIXTH_F32,
            BLOCK=lc["block"],
            **warps_kwargs(lc),
            **target.options,
        )
    return gd, mult, gd_rows, mult_rows
