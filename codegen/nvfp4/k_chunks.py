"""The W4A4 GEMMs' K-chunked summation order (configs.py 1.), the part split-K decode needs.

Shape legend: M rows (tokens), N out-features, K in-features, C = ceil(K / KC) chunks.

The order: K is cut into chunks of KC (`configs.k_chunk`, a property of the op, never of M);
each chunk is summed from zero by one ascending MMA chain into an FP32 accumulator, giving the
chunk partial p_c, and the partials are added in one fixed order,

    total = ((p_0 + p_1) + p_2) + ... + p_{C-1},   starting from p_0,

then the epilogue `reference.apply_global_scales` (+ bias) runs on `total`. The learner's GEMM
(`gemm_kernel`) folds inside its program; the decode GEMM (`decode_gemm_kernel`) may give the
chunks of an output to several programs, which store the partials [C, M, N] (FP32), and
`fold_chunks` below folds them in that order with the same epilogue, so a split changes no bit.
`reference.chunked_dot_ongrid` is the order's CPU statement for partials computed exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import arch_of, compile_options
from .gemm_tile import gathered_rows, tile_epilogue, tile_rows


def chunk_count(k: int, kc: int) -> int:
    """C, the chunks of a K-long sum in chunks of `kc` (0: one chain, one chunk)."""
    return 1 if kc <= 0 or k <= 0 else -(-k // kc)


@triton.jit
def _fold_chunks_kernel(
    part_ptr,
    gda_ptr,
    gdb_ptr,
    bias_ptr,
    out_ptr,
    group_end_ptr,
    a_rows_ptr,
    M,
    N,
    E,
    C,
    stride_pc,
    gda_stride,
    gdb_stride,
    stride_om,
    stride_on,
    GROUPED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    A_GATHER: tl.constexpr,
    GDA_SHARED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    # rows, experts, the gathered gd_a rows and GDA_SHARED exactly as the GEMM kernels read them
    c_tiles = tl.cdiv(N, BLOCK_C)
    t = tl.program_id(0).to(tl.int64) // c_tiles
    pid_c = tl.program_id(0).to(tl.int64) % c_tiles
    e, rows, row_end = tile_rows(t, group_end_ptr, M, E, BLOCK_R, BLOCK_E, GROUPED)
    if GROUPED:
        if e >= E:
            return
    rows, rmask, arows, amask = gathered_rows(rows, row_end, a_rows_ptr, A_GATHER)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    ptrs = part_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    total = tl.load(ptrs, mask=mask, other=0.0)  # p_0 starts the fold
    for c in range(1, C):
        total = total + tl.load(ptrs + c * stride_pc, mask=mask, other=0.0)
    tile_epilogue(
        total,
        rows,
        rmask,
        arows,
        amask,
        cols,
        cmask,
        e,
        gda_ptr,
        gda_stride,
        gdb_ptr,
        gdb_stride,
        bias_ptr,
        out_ptr,
        stride_om,
        stride_on,
        HAS_BIAS,
        GDA_SHARED,
        True,
    )


def fold_chunks(
    partials: torch.Tensor,
    gd_a: torch.Tensor,
    gd_b: torch.Tensor,
    out: torch.Tensor,
    *,
    bias: torch.Tensor | None,
    offsets: torch.Tensor | None,
    a_rows: torch.Tensor | None,
) -> torch.Tensor:
    """out[m, n] = epilogue(((p_0 + p_1) + ...) + p_{C-1}) for FP32 chunk partials [C, M, N]
    (contiguous), with the GEMM kernels' global scales (gd_a [] / [M_a] flattened, gathered by
    `a_rows` as the GEMM read it; gd_b [] / [E] per expert of the group ends `offsets`) and bias.
    Writes `out` [M, N] and returns it."""
    c, m, n = partials.shape
    if not partials.is_contiguous() or partials.dtype != torch.float32:
        raise ValueError(f"chunk partials must be contiguous FP32 [C, M, N], got {partials.dtype}")
    if c == 0 or m == 0 or n == 0:
        raise ValueError(f"chunk partials {tuple(partials.shape)}: C, M and N must be > 0")
    num_experts = offsets.numel() if offsets is not None else 1
    lc = pick_launch(arch_of(partials.device), "fold_chunks")
    rows_tiles = triton.cdiv(m, lc["block_r"]) + (num_experts if offsets is not None else 0)
    ends = offsets if offsets is not None else gd_a
    _fold_chunks_kernel[(rows_tiles * triton.cdiv(n, lc["block_c"]),)](
        partials,
        gd_a,
        gd_b,
        bias if bias is not None else gd_b,
        out,
        ends,
        a_rows if a_rows is not None else ends,
        m,
        n,
        num_experts,
        c,
        partials.stride(0),
        1 if gd_a.numel() > 1 else 0,
        1 if gd_b.numel() > 1 else 0,
        out.stride(0),
        out.stride(1),
        GROUPED=offsets is not None,
        HAS_BIAS=bias is not None,
        A_GATHER=a_rows is not None,
        GDA_SHARED=gd_a.numel() == 1,
        BLOCK_R=lc["block_r"],
        BLOCK_C=lc["block_c"],
        BLOCK_E=max(triton.next_power_of_2(num_experts), 2),
        **warps_kwargs(lc),
        **compile_options(partials.device),
    )
    return out
