"""Which expert and rows a program of a grouped GEMM owns: the experts' row tiles laid end to end
in one grid axis (`gemm_kernel`, `decode_gemm_kernel`)."""

import triton
import triton.language as tl


@triton.jit
def expert_row_tile(t, group_end_ptr, M, E, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """Row tile t of a grouped GEMM: (its expert e, its BLOCK_M row indices, the expert's row
    end). The experts' M tiles are laid end to end, tile_end[e] = the tiles of experts 0..e,
    computed from the group ends (no per-call layout tensors); e == E: t is past the last
    expert's tiles (the grid's spare programs, which return)."""
    eidx = tl.arange(0, BLOCK_E)
    emask = eidx < E
    row_hi = tl.load(group_end_ptr + eidx, mask=emask, other=0)
    row_lo = tl.load(group_end_ptr + eidx - 1, mask=emask & (eidx > 0), other=0)
    tiles = tl.where(emask, (row_hi - row_lo + BLOCK_M - 1) // BLOCK_M, 0)
    tile_end = tl.where(emask, tl.cumsum(tiles, 0), 2147483647)
    e = tl.sum((tile_end <= t).to(tl.int32), axis=0)
    is_e = eidx == e
    tile_start = tl.sum(tl.where(is_e, tile_end - tiles, 0), axis=0)
    row_start = tl.sum(tl.where(is_e, row_lo, 0), axis=0)
    row_end = tl.minimum(tl.sum(tl.where(is_e, row_hi, 0), axis=0), M)
    rows = row_start + (t - tile_start) * BLOCK_M + tl.arange(0, BLOCK_M)
    return e, rows, row_end
