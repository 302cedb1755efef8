"""Triton kernel of `fp4_compile::sample_argmax` (the decode program's Gumbel-max pick: scale,
noise, argmax in one pass over each row), and its launcher.

Shape legend: B rows, V vocabulary.

One program per row walks its V entries in BLOCK_V blocks. Each entry's key is computed as
torch's CUDA ops computed it (`decode_reference.sample_argmax`, reciprocal=True): the FP32 logit
times FP32(1 / FP32(T)) (ATen divides by a host scalar that way), plus the FP32 rounding of the
negated FP64 log-log (no FMA: `enable_fp_fusion=False`). Each lane keeps the first maximum of
its columns; the lanes' maxima are reduced with torch.argmax's order (`GreaterOrNan`: a NaN
beats any number, ties go to the lower id), so the pick is the first maximum of the row: an
exact selection, the same index on every schedule.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import kernel_target


@triton.jit
def _greater_or_nan(a, ia, b, ib):
    """(a, ia) comes first in torch.argmax's order: a NaN beats a number, else the larger value,
    ties (NaN with NaN, equal values) to the lower index."""
    a_nan = a != a
    b_nan = b != b
    return tl.where(a_nan, ~b_nan | (ia < ib), ((a == b) & (ia < ib)) | (a > b))


@triton.jit
def _first_max(a, ia, b, ib):
    first = _greater_or_nan(a, ia, b, ib)
    return tl.where(first, a, b), tl.where(first, ia, ib)


@triton.jit
def _sample_argmax_kernel(
    x_ptr,
    g_ptr,
    out_ptr,
    V,
    sx,
    sg,
    inv_t,
    SCALE: tl.constexpr,
    NOISE: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_V)
    best = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    best_i = tl.full((BLOCK_V,), 0, tl.int32) + V  # past every column: any real entry wins a tie
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + lanes
        live = cols < V
        key = tl.load(x_ptr + row * sx + cols, mask=live, other=0.0).to(tl.float32)
        if SCALE:
            key = key * inv_t
        if NOISE:
            loglog = tl.load(g_ptr + row * sg + cols, mask=live, other=0.0)
            key = key + (-loglog).to(tl.float32)
        take = live & _greater_or_nan(key, cols, best, best_i)
        best = tl.where(take, key, best)
        best_i = tl.where(take, cols, best_i)
    _, picked = tl.reduce((best, best_i), 0, _first_max)
    tl.store(out_ptr + row, picked.to(tl.int64))


def sample_argmax(logits_BV: torch.Tensor, gumbel_loglog_BV, temperature: float) -> torch.Tensor:
    """int64 [B]: `decode_reference.sample_argmax(..., reciprocal=True)` in one launch (the
    caller checked the arguments: logits [B, V] float, gumbel_loglog FP64 [B, V] or None)."""
    target = kernel_target(logits_BV, "logits")
    num, vocab = logits_BV.shape
    if logits_BV.stride(1) != 1:
        logits_BV = logits_BV.contiguous()
    noise = gumbel_loglog_BV is not None
    if noise and gumbel_loglog_BV.stride(1) != 1:
        gumbel_loglog_BV = gumbel_loglog_BV.contiguous()
    inv_t = (torch.tensor(1.0) / torch.tensor(float(temperature))).item()  # FP32 1 / FP32(T)
    out = torch.empty(num, dtype=torch.int64, device=logits_BV.device)
    lc = pick_launch(target.arch, "sample_argmax")
    if num:
        _sample_argmax_kernel[(num,)](
            logits_BV,
            gumbel_loglog_BV if noise else logits_BV,
            out,
            vocab,
            logits_BV.stride(0),
            gumbel_loglog_BV.stride(0) if noise else 0,
            inv_t,
            SCALE=inv_t != 1.0,
            NOISE=noise,
            BLOCK_V=lc["block_v"],
            **warps_kwargs(lc),
            **target.options,
        )
    return out
