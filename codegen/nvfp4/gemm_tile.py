"""The tile prologue and epilogue of every NVFP4 GEMM kernel: the learner's GEMM (`gemm_kernel`),
the decode GEMM (`decode_gemm_kernel`) and the split-K fold (`k_chunks.fold_chunks`) call these,
so which rows a tile reads and how its accumulator becomes the output are one piece of code, and
the kernels' bit equality does not rest on copies staying in step.

Shape legend: M rows (tokens), N out-features, E experts.

- `tile_rows`: the rows of row tile t (one group of M rows, or, GROUPED, the t-th tile of the
  expert groups ending at group_end: `triton_helpers.expert_row_tile`), with e its expert. A
  grouped kernel returns at once when e >= E (a tile past the last group; the helpers cannot
  return for it).
- `gathered_rows`: the int64 rows, their mask, and the A rows they read: A_GATHER reads row
  a_rows[r] of A (and of a per-row gd_a), a zero row where a_rows[r] < 0.
- `tile_epilogue`: out = (acc * gd_a[row]) * gd_b[e] (+ bias[col]) in FP32, then the output
  cast, exactly `reference.apply_global_scales` (FMA contraction is off on CUDA:
  `runtime.compile_options`). GDA_SHARED: one gd_a for every row, zero rows included. acc is
  [rows, cols] (ROWS_FIRST) or [cols, rows] (the decode kernel's swapped operands).
  Its halves: `row_global_decodes` (the rows' gd_a) and `scaled_store` (the rest, from global
  decodes in registers: the decode GEMM that quantizes A in its prologue holds its own).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_helpers import expert_row_tile


@triton.jit
def tile_rows(
    t, group_end_ptr, M, E, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr, GROUPED: tl.constexpr
):
    if GROUPED:
        e, rows, row_end = expert_row_tile(t, group_end_ptr, M, E, BLOCK_R, BLOCK_E)
    else:
        e = 0
        row_end = M
        rows = t * BLOCK_R + tl.arange(0, BLOCK_R)
    return e, rows, row_end


@triton.jit
def gathered_rows(rows, row_end, a_rows_ptr, A_GATHER: tl.constexpr):
    rows = rows.to(tl.int64)  # int64 offsets (codegen/runtime.py)
    rmask = rows < row_end
    if A_GATHER:
        arows = tl.load(a_rows_ptr + rows, mask=rmask, other=-1).to(tl.int64)
        amask = rmask & (arows >= 0)
    else:
        arows = rows
        amask = rmask
    return rows, rmask, arows, amask


@triton.jit
def tile_epilogue(
    acc,
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
    HAS_BIAS: tl.constexpr,
    GDA_SHARED: tl.constexpr,
    ROWS_FIRST: tl.constexpr,
):
    gda = row_global_decodes(gda_ptr, gda_stride, rows, rmask, arows, amask, GDA_SHARED)
    scaled_store(
        acc,
        gda,
        rows,
        rmask,
        cols,
        cmask,
        e,
        gdb_ptr,
        gdb_stride,
        bias_ptr,
        out_ptr,
        stride_om,
        stride_on,
        HAS_BIAS,
        ROWS_FIRST,
    )


@triton.jit
def row_global_decodes(gda_ptr, gda_stride, rows, rmask, arows, amask, GDA_SHARED: tl.constexpr):
    """The rows' gd_a, 1.0 where a row is masked (`tile_epilogue`'s first half)."""
    if GDA_SHARED:  # one gd_a for every row (gda_stride 0), zero rows included
        return tl.load(gda_ptr + rows * 0, mask=rmask, other=1.0)
    else:
        return tl.load(gda_ptr + arows * gda_stride, mask=amask, other=1.0)


@triton.jit
def scaled_store(
    acc,
    gda,
    rows,
    rmask,
    cols,
    cmask,
    e,
    gdb_ptr,
    gdb_stride,
    bias_ptr,
    out_ptr,
    stride_om,
    stride_on,
    HAS_BIAS: tl.constexpr,
    ROWS_FIRST: tl.constexpr,
):
    """`tile_epilogue` from the rows' global decodes gda [rows] (1.0 where a row is masked)."""
    gdb = tl.load(gdb_ptr + e * gdb_stride)
    if ROWS_FIRST:
        out = (acc * gda[:, None]) * gdb
        if HAS_BIAS:
            out = out + tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        tl.store(
            out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
            out.to(out_ptr.dtype.element_ty),
            mask=rmask[:, None] & cmask[None, :],
        )
    else:
        out = (acc * gda[None, :]) * gdb
        if HAS_BIAS:
            out = out + tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[:, None]
        tl.store(
            out_ptr + rows[None, :] * stride_om + cols[:, None] * stride_on,
            out.to(out_ptr.dtype.element_ty),
            mask=rmask[None, :] & cmask[:, None],
        )
