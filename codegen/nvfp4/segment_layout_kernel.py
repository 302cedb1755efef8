"""The MoE wgrad's padded token layout, in one launch.

Shape legend: T tokens sorted by expert, E experts (`offsets`: int32 group ends, the grouped
GEMMs' `offs`), C = T + 15 E rounded up to 16 columns (a bound known without reading the
offsets on the host).

Expert e's tokens [ends[e-1], ends[e]) become the columns [start[e], start[e] + width[e]) of a
[., C] operand, width[e] = its token count rounded up to 16, segments laid end to end; `src[c]`
is the token of column c (-1: padding, read as zeros) and `block_group[b]` the expert of the
16-column block b (the last expert for the tail after every segment). The same values as the
torch ops `tests/codegen/nvfp4/test_segment_layout.py` holds as the reference (a cumsum, two
searchsorted, gathers and a scatter: about 20 small kernels per MoE backward call, replayed at
every step); here every program derives its columns' segment from the E group ends itself
(a segment is found by counting the padded ends at or before the column, which is what
`searchsorted(..., right=True)` returns), and program 0 writes start and width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...format import BLOCK_SIZE
from ..configs import pick_launch
from ..runtime import arch_of, check_kernel_device


@triton.jit
def _segment_layout_kernel(
    ends_ptr,
    src_ptr,
    group_ptr,
    start_ptr,
    width_ptr,
    row_index_ptr,
    src_rows_ptr,
    E,
    C,
    BLOCK_C: tl.constexpr,
    BLOCK_E: tl.constexpr,
    ROW_INDEX: tl.constexpr,
):
    # int32 throughout (tokens and columns < 2**31, checked by the launcher), and small
    # [BLOCK_C, BLOCK_E] tiles: a [64, 128] int64 tile spills to local memory on the H200
    # (benchmarks/results/2026-12-04_learner_ea76afb.md)
    pid = tl.program_id(0).to(tl.int64)
    c = pid * BLOCK_C + tl.arange(0, BLOCK_C)  # this program's columns
    b = pid * (BLOCK_C // 16) + tl.arange(0, BLOCK_C // 16)  # and its 16-column blocks
    big = 2147483647
    n_le = tl.zeros((BLOCK_C,), tl.int32)  # segments ending at or before c: c's segment index
    seg_begin = tl.zeros((BLOCK_C,), tl.int32)  # the column where c's segment begins
    tok_begin = tl.zeros((BLOCK_C,), tl.int32)  # its first token (ends[g - 1])
    tok_end = tl.full((BLOCK_C,), big, tl.int32)  # its end token (ends[g])
    blk_le = tl.zeros((BLOCK_C // 16,), tl.int32)
    col_carry = tl.sum(tl.zeros((BLOCK_E,), tl.int32), 0)  # padded columns of earlier chunks
    for e0 in range(0, E, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        emask = e < E
        ends = tl.load(ends_ptr + e, mask=emask, other=0).to(tl.int32)
        before = tl.load(ends_ptr + e - 1, mask=emask & (e > 0), other=0).to(tl.int32)
        width = tl.where(emask, (ends - before + 15) & -16, 0)
        pend = tl.cumsum(width, 0) + col_carry  # padded segment ends, nondecreasing
        if pid == 0:
            tl.store(start_ptr + e, (pend - width).to(tl.int64), mask=emask)
            tl.store(width_ptr + e, width.to(tl.int64), mask=emask)
        pend_m = tl.where(emask, pend, big)
        le = pend_m[None, :] <= c[:, None]  # [BLOCK_C, BLOCK_E]: a prefix of the experts
        n_le += tl.sum(le.to(tl.int32), 1)
        seg_begin = tl.maximum(seg_begin, tl.max(tl.where(le, pend, 0), 1))
        tok_begin = tl.maximum(tok_begin, tl.max(tl.where(le, ends, 0), 1))
        tok_end = tl.minimum(tok_end, tl.min(tl.where(le | ~emask[None, :], big, ends), 1))
        blk_le += tl.sum((pend_m[None, :] <= (b * 16)[:, None]).to(tl.int32), 1)
        col_carry += tl.sum(width, 0)
    off = c - seg_begin
    inside = (n_le < E) & (off < tok_end - tok_begin)
    src = tl.where(inside, tok_begin + off, -1)
    tl.store(src_ptr + c, src.to(tl.int64), mask=c < C)
    if ROW_INDEX:  # the source row of each column's token, through the gather index
        row = tl.load(row_index_ptr + src, mask=inside & (c < C), other=-1).to(tl.int64)
        tl.store(src_rows_ptr + c, tl.where(inside, row, -1), mask=c < C)
    group = tl.minimum(blk_le, E - 1)
    tl.store(group_ptr + b, group, mask=b < C // 16)


def segment_layout(
    offsets: torch.Tensor, num_tokens: int, row_index: torch.Tensor | None = None
) -> dict:
    """Device tensors of the padded layout of `num_tokens` tokens grouped by `offsets` (int32
    [E] group ends): `src` int64 [C] (the token of each column, -1 padding), `start` / `width`
    int64 [E] (each expert's columns), `block_group` int32 [C / 16] (each 16-column block's
    expert), and `cols` = C. With `row_index` (int [num_tokens]: token t is row row_index[t]
    of a source tensor, the MoE gather) also `src_rows` int64 [C]: row_index[src], -1 padding."""
    check_kernel_device(offsets, "offsets")
    if offsets.dim() != 1 or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"offsets must be int32/int64 [E], got {offsets.dtype}{list(offsets.shape)}"
        )
    num_experts = offsets.shape[0]
    if num_experts == 0:
        raise ValueError("offsets must hold at least one expert's end")
    if row_index is not None and (
        row_index.dim() != 1 or row_index.shape[0] != num_tokens or row_index.is_floating_point()
    ):
        raise ValueError(
            f"row_index must be an integer [{num_tokens}] tensor, got "
            f"{row_index.dtype}{list(row_index.shape)}"
        )
    cols = -(-(num_tokens + (BLOCK_SIZE - 1) * num_experts) // BLOCK_SIZE) * BLOCK_SIZE
    dev = offsets.device
    src = torch.empty((cols,), dtype=torch.int64, device=dev)
    group = torch.empty((cols // BLOCK_SIZE,), dtype=torch.int32, device=dev)
    start = torch.empty((num_experts,), dtype=torch.int64, device=dev)
    width = torch.empty((num_experts,), dtype=torch.int64, device=dev)
    if cols >= 2**31:
        raise ValueError(f"{num_tokens} tokens over {num_experts} experts: more than 2**31 columns")
    lc = pick_launch(arch_of(dev), "segment_layout")
    block_e = min(lc["max_block_e"], triton.next_power_of_2(num_experts))
    block_c = max(BLOCK_SIZE, lc["tile_elements"] // block_e)
    src_rows = torch.empty_like(src) if row_index is not None else None
    _segment_layout_kernel[(triton.cdiv(cols, block_c),)](
        offsets,
        src,
        group,
        start,
        width,
        row_index if row_index is not None else src,
        src_rows if src_rows is not None else src,
        num_experts,
        cols,
        BLOCK_C=block_c,
        BLOCK_E=block_e,
        ROW_INDEX=row_index is not None,
    )
    out = {"src": src, "start": start, "width": width, "cols": cols, "block_group": group}
    if src_rows is not None:
        out["src_rows"] = src_rows
    return out
