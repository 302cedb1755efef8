"""Per-program partial sums [P, H] (FP32) -> their column sums [H] in the output dtype, in ONE
Triton launch with a fixed order; the second launch of `rms_norm_backward` (its dweight). It
replaced `partial.sum(0).to(dtype)`: a torch reduce and a cast, two kernels per call.

Shape legend: P programs (rows of partials), H columns.

The order, a function of P only (`partial_sum_reference` writes it out as torch ops):
- CHAINS interleaved chains per column: chain c adds rows c, c + CHAINS, c + 2 * CHAINS, ...
  in that order with FP32 adds, starting from its first row (no identity element: a sum of
  -0.0 stays -0.0); a chain with no row (P < CHAINS) is empty;
- the chains' sums are added as a pairwise tree, (c0 + c1) + (c2 + c3), ..., each level one
  FP32 add of two values written with `tl.split` (no other association possible), a node with
  an empty right half passed up unchanged;
- one rounding of the FP32 sum to the output dtype (round to nearest even). The interpreter's
  FP32 -> 16-bit casts truncate: there the launcher stores FP32 and torch casts.
CHAINS = 1 is the plain sequential sum over rows 0, 1, ..., P - 1.

Why chains: the plain sequential order (CHAINS = 1) keeps only H dependent chains of P loads
and adds in flight, slower than torch's sum + cast at the learner's shapes on the H200; 64
interleaved chains read one [BLOCK_H, 64] tile of consecutive rows per step (coalesced,
software-pipelined: `configs.LAUNCH`) and are several times faster than either (16 chains are
slower, 128 and 256 no faster).
Error: every term passes through at most ceil(P / CHAINS) - 1 + ceil(log2(min(P, CHAINS))) FP32
adds (an empty node adds nothing), never more than the sequential sum's P - 1: |error| <=
(P - 1) * 2**-24 * sum|terms| (to first order) before the final rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import arch_of, check_kernel_device, compile_options, interpreting
from .reference import PARTIAL_SUM_CHAINS as CHAINS  # the order of the sum (docstring above)
from .reference import partial_sum as partial_sum_reference  # noqa: F401  (the order, as torch ops)

# the tile, warps and stages: speed only (no bit depends on them), `configs.LAUNCH`


@triton.jit
def _partial_sum_kernel(
    p_ptr,
    out_ptr,
    P,
    H,
    CHAINS: tl.constexpr,
    LOG_CHAINS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    cols = tl.program_id(0).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    live = cols < H
    chain = tl.arange(0, CHAINS)
    ptrs = p_ptr + chain[None, :] * H + cols[:, None]  # [BLOCK_H, CHAINS]: rows 0..CHAINS-1
    # each chain starts from its first row; chains past P stay empty (skipped by the tree)
    acc = tl.load(ptrs, mask=live[:, None] & (chain < P)[None, :], other=0.0)
    full = P // CHAINS
    for t in tl.range(1, full, num_stages=NUM_STAGES):
        acc += tl.load(ptrs + t * CHAINS * H, mask=live[:, None], other=0.0)
    if full >= 1 and full * CHAINS < P:  # the last, partial tile: the first chains' last rows
        rows = full * CHAINS + chain
        x = tl.load(ptrs + full * CHAINS * H, mask=live[:, None] & (rows < P)[None, :], other=0.0)
        acc = tl.where((rows < P)[None, :], acc + x, acc)
    for level in tl.static_range(LOG_CHAINS):
        left, right = tl.split(tl.reshape(acc, (BLOCK_H, CHAINS >> (level + 1), 2)))
        first_right = tl.arange(0, CHAINS >> (level + 1)) * (2 << level) + (1 << level)
        acc = tl.where((first_right < P)[None, :], left + right, left)
    tl.store(out_ptr + cols, tl.reshape(acc, (BLOCK_H,)).to(out_ptr.dtype.element_ty), mask=live)


def partial_sum(
    partial_PH: torch.Tensor, out_dtype: torch.dtype, *, chains: int = CHAINS
) -> torch.Tensor:
    """partial [P >= 1, H] FP32 -> [H] in out_dtype: the fixed-order sum over P (module
    docstring). `chains` (a power of two) is part of the order; tests vary it."""
    check_kernel_device(partial_PH, "partial")
    p = partial_PH
    if p.dim() != 2 or p.shape[0] < 1 or p.dtype != torch.float32 or not p.is_contiguous():
        raise ValueError(
            f"partial must be contiguous FP32 [P >= 1, H], got {p.dtype} {tuple(p.shape)} "
            f"strides {p.stride()}"
        )
    if chains < 1 or chains & (chains - 1):
        raise ValueError(f"chains must be a power of two, got {chains}")
    num_programs, hdim = p.shape
    interp = interpreting()
    out = torch.empty(hdim, dtype=torch.float32 if interp else out_dtype, device=p.device)
    if hdim:
        lc = pick_launch(arch_of(p.device), "partial_sum")
        block_h = min(max(lc["tile_elements"] // chains, 1), triton.next_power_of_2(hdim))
        _partial_sum_kernel[(triton.cdiv(hdim, block_h),)](
            p,
            out,
            num_programs,
            hdim,
            CHAINS=chains,
            LOG_CHAINS=chains.bit_length() - 1,
            BLOCK_H=block_h,
            NUM_STAGES=lc["num_stages"],
            **warps_kwargs(lc),
            **compile_options(p.device),
        )
    return out.to(out_dtype)
