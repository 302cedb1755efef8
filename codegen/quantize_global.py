"""The per-row global stage of the quantizer (steps 1-4 of `reference.quantize`) in ONE Triton
launch: per row amax = max |x|, then global_encode, global_decode and the block-scale multiplier.

In torch those steps are about nine launches (abs, amax, cast, full, divide, clamp, where, divide,
multiply) per quantize call; on the H200 they were most of the host time of a decode-size NVFP4
linear. Bitwise equal to `quantize_kernel.global_stage(x, "per_row")`:
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

from .abs_max import _CONFIG, row_abs_max_nan
from .quantize_kernel import _ONE_SIXTH_F32
from .runtime import arch_of, compile_options

# The amax loop and its tiling are abs_max's (max is exact in any order: no bit can change).


@triton.jit
def _row_global_kernel(
    x_ptr, gd_ptr, mult_ptr, R, K, stride_xr, one_sixth,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    amax, nan = row_abs_max_nan(x_ptr, rows, rmask, K, stride_xr, BLOCK_R, BLOCK_K)
    enc = tl.minimum(
        tl.math.div_rn(tl.full((BLOCK_R,), 2688.0, tl.float32), amax), 3.4028234663852886e38
    )
    enc = tl.where(enc == 0.0, 1.0, enc)
    gd = tl.math.div_rn(tl.full((BLOCK_R,), 1.0, tl.float32), enc)
    mult = enc * one_sixth
    is_nan = nan > 0
    gd = tl.where(is_nan, float("nan"), gd)
    mult = tl.where(is_nan, float("nan"), mult)
    tl.store(gd_ptr + rows, gd, mask=rmask)
    tl.store(mult_ptr + rows, mult, mask=rmask)


def row_global_stage(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x2 [R, K] (unit stride along K) -> (global_decode [R], multiplier [R]), FP32."""
    if x2.dim() != 2 or (x2.shape[1] > 1 and x2.stride(1) != 1):
        raise ValueError(f"x2 must be [R, K] with a unit stride along K, got {tuple(x2.shape)}")
    r, k = x2.shape
    gd = torch.empty(r, dtype=torch.float32, device=x2.device)
    mult = torch.empty(r, dtype=torch.float32, device=x2.device)
    arch = arch_of(x2.device)
    block_r, block_k, warps = _CONFIG.get(arch, _CONFIG["sm_90"])
    if r:
        _row_global_kernel[(triton.cdiv(r, block_r),)](
            x2, gd, mult, r, k, x2.stride(0), _ONE_SIXTH_F32,
            BLOCK_R=block_r, BLOCK_K=block_k, num_warps=warps, **compile_options(x2.device),
        )  # fmt: skip
    return gd, mult
