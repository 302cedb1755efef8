"""max |x| in ONE read of x: per row (`row_abs_max`), per tensor (`tensor_abs_max`), over a
group of tensors (`group_abs_max`), per expert segment of tokens sorted by expert
(`segment_abs_max`), and per (expert segment, column) (`segment_column_abs_max`): the global
stage of a per-tensor NVFP4 quantize (the gradient's, in every wgrad and dgrad), the amax a
shared-scale weight group shares, and the per-expert amaxes of the grouped wgrad, without the
full-size write and read of an `x.abs()` (benchmarks/results/2026-12-03_learner.md).

Bitwise equal to `x.abs().amax(...).to(torch.float32)`: |x| of a BF16/FP16/FP32 value is exact
in FP32 and max is exact in any order, so the tiling cannot change a bit; a NaN anywhere in a
row makes its amax NaN, as torch's amax does (the NaN payload may differ)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import KernelTarget, arch_of, check_kernel_device, compile_options, kernel_target


@triton.jit
def row_abs_max_nan(x_ptr, rows, rmask, K, stride_xr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(max |x| FP32 [BLOCK_R], any-NaN flag int32 [BLOCK_R]) of the given rows: the loop shared
    with the per-row global stage of `global_scale_kernel`."""
    amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
    nan = tl.zeros((BLOCK_R,), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = rmask[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xr + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        nan = tl.maximum(nan, tl.max((x != x).to(tl.int32), axis=1))
    return amax, nan


@triton.jit
def _row_abs_max_kernel(
    x_ptr, out_ptr, R, K, stride_xr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    amax, nan = row_abs_max_nan(x_ptr, rows, rmask, K, stride_xr, BLOCK_R, BLOCK_K)
    tl.store(out_ptr + rows, tl.where(nan > 0, float("nan"), amax), mask=rmask)


def row_abs_max(x2: torch.Tensor, *, target: KernelTarget | None = None) -> torch.Tensor:
    """x2 [R, K] with a unit stride along K -> max |x| per row, FP32 [R] (0 for K = 0).
    `target`: the caller's `runtime.kernel_target` of x2 (looked up here without one)."""
    target = target or kernel_target(x2, "x")
    if x2.dim() != 2 or (x2.shape[1] > 1 and x2.stride(1) != 1):
        raise ValueError(f"x must be [R, K] with a unit stride along K, got {tuple(x2.shape)}")
    r, k = x2.shape
    # every row is written when K > 0 (no memset to replay per call); zeros for K = 0
    out = (torch.empty if k else torch.zeros)(r, dtype=torch.float32, device=x2.device)
    lc = pick_launch(target.arch, "row_abs_max")
    if r and k:
        _row_abs_max_kernel[(triton.cdiv(r, lc["block_r"]),)](
            x2,
            out,
            r,
            k,
            x2.stride(0),
            BLOCK_R=lc["block_r"],
            BLOCK_K=lc["block_k"],
            **warps_kwargs(lc),
            **target.options,
        )
    return out


@triton.jit
def _chunk_abs_max_kernel(
    x_ptr, out_ptr, R, K, P, stride_xr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr
):
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < R
    cols = tl.program_id(1).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = rmask[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xr + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    nan = tl.max((x != x).to(tl.int32), axis=1)
    tl.store(
        out_ptr + rows * P + tl.program_id(1).to(tl.int64),
        tl.where(nan > 0, float("nan"), amax),
        mask=rmask,
    )


def chunk_abs_max(x2: torch.Tensor, *, target: KernelTarget) -> torch.Tensor:
    """x2 [R, K] (unit stride along K, K > 0) -> max |x| per row and column chunk, FP32 [R, P]
    (NaN where the chunk holds one), over (row blocks, chunks) programs: the parts that
    `row_codes_kernel` folds into the rows' maxima, so that few rows still fill the GPU."""
    r, k = x2.shape
    lc = pick_launch(target.arch, "chunk_abs_max")
    out = torch.empty((r, triton.cdiv(k, lc["block_k"])), dtype=torch.float32, device=x2.device)
    if r:
        _chunk_abs_max_kernel[(triton.cdiv(r, lc["block_r"]), out.shape[1])](
            x2,
            out,
            r,
            k,
            out.shape[1],
            x2.stride(0),
            BLOCK_R=lc["block_r"],
            BLOCK_K=lc["block_k"],
            **warps_kwargs(lc),
            **target.options,
        )
    return out


@triton.jit
def _vector_abs_max_kernel(v_ptr, out_ptr, n, BLOCK: tl.constexpr):
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    nan = tl.zeros((BLOCK,), dtype=tl.int32)
    for i0 in range(0, n, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        v = tl.load(v_ptr + i, mask=i < n, other=0.0)
        amax = tl.maximum(amax, tl.abs(v))
        nan = tl.maximum(nan, (v != v).to(tl.int32))
    m = tl.max(amax, axis=0)
    tl.store(out_ptr, tl.where(tl.max(nan, axis=0) > 0, float("nan"), m))


def vector_abs_max(v: torch.Tensor) -> torch.Tensor:
    """max |v| of a non-empty FP32 vector (row maxima), FP32 [], NaN if one is NaN: one program
    (torch's `.amax()` of a few thousand row maxima took 2-9 us per call on the H200)."""
    check_kernel_device(v, "v")
    if v.dim() != 1 or v.dtype != torch.float32 or not v.numel():
        raise ValueError(f"v must be a non-empty FP32 vector, got {v.dtype}{list(v.shape)}")
    out = torch.empty((), dtype=torch.float32, device=v.device)
    lc = pick_launch(arch_of(v.device), "vector_abs_max")
    _vector_abs_max_kernel[(1,)](
        v.contiguous(),
        out,
        v.numel(),
        BLOCK=lc["block"],
        **warps_kwargs(lc),
        **compile_options(v.device),
    )
    return out


def tensor_abs_max(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the whole tensor, FP32 [] (0 for an empty tensor)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    rows = row_abs_max(x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(1, -1))
    return vector_abs_max(rows)


def group_abs_max(weights: list[torch.Tensor]) -> torch.Tensor:
    """max |w| over every tensor of `weights` (a shared-scale weight group), FP32 []: one read of
    each (its row maxima), then one program over all the row maxima; 0 when all are empty."""
    rows = [
        row_abs_max(w.reshape(-1, w.shape[-1]) if w.dim() > 1 else w.reshape(1, -1))
        for w in weights
        if w.numel()
    ]
    if not rows:
        return torch.zeros((), dtype=torch.float32, device=weights[0].device)
    return vector_abs_max(torch.cat(rows))


def segment_abs_max(x_TD: torch.Tensor, ends: torch.Tensor, rows: torch.Tensor | None = None):
    """max |x| over the rows of each expert (rows sorted by expert, expert e's rows
    [ends[e-1], ends[e])) -> FP32 [E], 0 for an expert without rows: the row maxima (one read
    of x; or `rows`, x's `row_abs_max` when the caller has it), then each expert's max of its
    rows' (`segment_column_abs_max` of one column): faster on the H200 than a scatter_reduce of
    the row maxima into E bins (atomics on E addresses) or the column kernel over all of x
    (benchmarks/results/2026-12-04_learner_1bb6149.md)."""
    if rows is None:
        rows = row_abs_max(x_TD)
    return segment_column_abs_max(rows.reshape(-1, 1), ends).reshape(-1)


@triton.jit
def _segment_column_abs_max_kernel(
    x_ptr, ends_ptr, out_ptr, D, stride_xt, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr
):
    e = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    start = tl.where(e > 0, tl.load(ends_ptr + e - 1, mask=e > 0, other=0), 0).to(tl.int64)
    end = tl.load(ends_ptr + e).to(tl.int64)
    amax = tl.zeros((BLOCK_D,), dtype=tl.float32)
    nan = tl.zeros((BLOCK_D,), dtype=tl.int32)
    for t0 in range(start, end, BLOCK_T):
        rows = t0 + tl.arange(0, BLOCK_T)
        mask = (rows < end)[:, None] & cmask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xt + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
        nan = tl.maximum(nan, tl.max((x != x).to(tl.int32), axis=0))
    tl.store(out_ptr + e.to(tl.int64) * D + cols, tl.where(nan > 0, float("nan"), amax), mask=cmask)


def segment_column_abs_max(x_TD: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """max |x| per column over the rows of each expert -> FP32 [E, D]: rows sorted by expert,
    expert e's rows [ends[e-1], ends[e]) (`ends` int [E], the grouped GEMMs' offsets); 0 for an
    expert without rows, NaN where a column of its rows holds one. Bitwise the values of
    `zeros([E, D]).scatter_reduce_(0, expert[:, None], x.abs().float(), "amax")` on finite x,
    in one read of x (that wrote |x| in FP32 first, then scattered it)."""
    check_kernel_device(x_TD, "x")
    if x_TD.dim() != 2 or (x_TD.shape[1] > 1 and x_TD.stride(1) != 1):
        raise ValueError(f"x must be [T, D] with a unit stride along D, got {tuple(x_TD.shape)}")
    if ends.dim() != 1 or ends.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ends must be int32/int64 [E], got {ends.dtype}{list(ends.shape)}")
    num_experts, d = ends.shape[0], x_TD.shape[1]
    out = torch.empty((num_experts, d), dtype=torch.float32, device=x_TD.device)  # all written
    lc = pick_launch(arch_of(x_TD.device), "segment_column_abs_max")
    block_d = min(lc["max_block_d"], max(16, triton.next_power_of_2(d)))
    block_t = lc["tile_elements"] // block_d * 16  # rows per step: 16 x tile / block_d
    if num_experts and d:
        _segment_column_abs_max_kernel[(num_experts, triton.cdiv(d, block_d))](
            x_TD,
            ends,
            out,
            d,
            x_TD.stride(0),
            BLOCK_T=block_t,
            BLOCK_D=block_d,
            **warps_kwargs(lc),
            **compile_options(x_TD.device),
        )
    return out
