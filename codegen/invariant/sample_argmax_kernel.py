"""Triton kernel of `fp4_compile::sample_argmax` (the decode program's Gumbel-max pick: scale,
seeded noise, argmax in one launch), and its launcher.

Shape legend: B rows, V vocabulary, S chunks of a row (CHUNK_V entries each).

One program per (row, chunk) walks its chunk in BLOCK_V blocks. Each entry's key is computed as
torch's CUDA ops computed it (`decode_reference.sample_argmax`, reciprocal=True): the FP32 logit
times FP32(1 / FP32(T)) (ATen divides by a host scalar that way), plus FP32(-log(-log(u))) of the
row's seeded uniform u, made in registers (`gumbel_noise_kernel`: the same integers, the same
FP64 logs as torch's CUDA `log`; no FMA: `enable_fp_fusion=False`). No noise tensor is written.
Each lane keeps the first maximum of its columns; the lanes' maxima are reduced with
torch.argmax's order (`GreaterOrNan`: a NaN beats any number, ties go to the lower id).

The chunks of a row meet in one int64 per row: the chunk's first maximum packed so that the
signed integer order is torch.argmax's order (the value's bits made monotone, -0 as +0, every
NaN as the largest; then the id reversed, so a tie goes to the lower id), merged with an atomic
max (order-free: an exact selection, the same pick whatever the schedule or the chunk count).
The program that counts last reads the row's maximum, writes the pick and resets the row's max
and count for the next call (so the scratch, made once per (device, B), stays ready: CUDA-graph
safe, no host work per call).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import interpreting, kernel_target
from .gumbel_noise_kernel import gumbel_loglog, gumbel_row_key, gumbel_uniform

LOWEST = -(2**63)  # below every packed key (a packed key's high word is > -2**31)
_SCRATCH: dict = {}  # (device, B) -> (row maxima int64 [B], chunk counts int32 [B])


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
def _packed(value, index):
    """int64 whose signed order is torch.argmax's order on (value, index) (module docstring)."""
    bits = tl.where(value == 0, 0.0, value).to(tl.int32, bitcast=True)  # -0 ties with +0
    monotone = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: the low 31 bits reversed
    monotone = tl.where(value != value, 0x7FFFFFFF, monotone)  # every NaN: above +inf
    return (monotone.to(tl.int64) << 32) + (2147483647 - index).to(tl.int64)


@triton.jit
def _sample_argmax_kernel(
    x_ptr,
    keys_ptr,
    step_ptr,
    step_stride,
    best_ptr,
    count_ptr,
    out_ptr,
    V,
    sx,
    inv_t,
    SCALE: tl.constexpr,
    NOISE: tl.constexpr,
    INTERP: tl.constexpr,
    BLOCK_V: tl.constexpr,
    CHUNK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)  # int32 index: a vocabulary column (< V < 2**31), unit stride
    lanes = tl.arange(0, BLOCK_V)
    if NOISE:
        key, step_key = gumbel_row_key(keys_ptr, step_ptr, step_stride, row)
    best = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    best_i = tl.full((BLOCK_V,), 0, tl.int32) + V  # past every column: any real entry wins a tie
    for v0 in range(0, CHUNK_V, BLOCK_V):
        cols = chunk * CHUNK_V + v0 + lanes
        live = cols < V
        x = tl.load(x_ptr + row * sx + cols, mask=live, other=0.0).to(tl.float32)
        if SCALE:
            x = x * inv_t
        if NOISE:
            loglog = gumbel_loglog(gumbel_uniform(cols, key, step_key), INTERP)
            x = x + (-loglog).to(tl.float32)
        take = live & _greater_or_nan(x, cols, best, best_i)
        best = tl.where(take, x, best)
        best_i = tl.where(take, cols, best_i)
    value, index = tl.reduce((best, best_i), 0, _first_max)
    tl.atomic_max(best_ptr + row, _packed(value, index))
    arrived = tl.atomic_add(count_ptr + row, 1)  # acq_rel: the max above lands first
    if arrived == tl.num_programs(1) - 1:  # the row's last chunk: every max is in
        lowest = tl.full((), -2147483648, tl.int64) << 32
        top = tl.atomic_xchg(best_ptr + row, lowest)  # read and reset for the next call
        tl.atomic_xchg(count_ptr + row, 0)
        picked = 2147483647 - (top - ((top >> 32) << 32))
        tl.store(out_ptr + row, picked)


def _scratch(device: torch.device, num: int):
    """The per-row maxima (LOWEST) and counts (0) of B = num rows on `device`: made once, kept
    (a captured decode program replays on their addresses), left reset by every launch."""
    got = _SCRATCH.get((device, num))
    if got is None:
        best = torch.full((num,), LOWEST, dtype=torch.int64, device=device)
        got = _SCRATCH[device, num] = (best, torch.zeros(num, dtype=torch.int32, device=device))
    return got


def sample_argmax(logits_BV: torch.Tensor, keys_B, step, temperature: float) -> torch.Tensor:
    """int64 [B]: `decode_reference.sample_argmax(..., reciprocal=True)` in one launch (the
    caller checked the arguments: logits [B, V] float; keys int64 [B] and step int64 [] or [B],
    or both None: no noise)."""
    target = kernel_target(logits_BV, "logits")
    num, vocab = logits_BV.shape
    if logits_BV.stride(1) != 1:
        logits_BV = logits_BV.contiguous()
    noise = keys_B is not None
    if noise:
        keys_B = keys_B.contiguous()
    inv_t = (torch.tensor(1.0) / torch.tensor(float(temperature))).item()  # FP32 1 / FP32(T)
    out = torch.empty(num, dtype=torch.int64, device=logits_BV.device)
    lc = pick_launch(target.arch, "sample_argmax")
    if num:
        best, count = _scratch(logits_BV.device, num)
        _sample_argmax_kernel[(num, triton.cdiv(vocab, lc["chunk_v"]))](
            logits_BV,
            keys_B if noise else out,
            step if noise else out,
            (step.stride(0) if step.dim() else 0) if noise else 0,
            best,
            count,
            out,
            vocab,
            logits_BV.stride(0),
            inv_t,
            SCALE=inv_t != 1.0,
            NOISE=noise,
            INTERP=interpreting(),
            BLOCK_V=lc["block_v"],
            CHUNK_V=lc["chunk_v"],
            **warps_kwargs(lc),
            **target.options,
        )
    return out
