"""Block-scale layout converters: linear [R, K/16] <-> the swizzled 128x4 tile layout.

The layout cuBLASLt, CUTLASS, vLLM and FlashInfer's Blackwell GEMMs read ("block scaling factors
layout" in the cuBLAS docs): rows padded to a multiple of 128, scale columns to a multiple of 4,
zeros in the padding; the matrix is cut into 128x4 tiles stored one after the other, row-major
over tiles; inside a tile, scale (r, c) (r < 128, c < 4) lives at byte offset
(r % 32) * 16 + (r // 32) * 4 + c, i.e. the tile is stored as [32][4][4].
"""

from __future__ import annotations

import torch

TILE_ROWS = 128
TILE_COLS = 4


def _ceil_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    """Padded (rows, cols) of the swizzled layout."""
    return _ceil_to(rows, TILE_ROWS), _ceil_to(cols, TILE_COLS)


def to_swizzled(scales: torch.Tensor) -> torch.Tensor:
    """[R, C] linear scales (any 1-byte dtype) -> flat [R_pad * C_pad] swizzled, same dtype."""
    if scales.dim() != 2:
        raise ValueError(f"scales must be 2D [R, K/16], got shape {tuple(scales.shape)}")
    if scales.element_size() != 1:
        raise TypeError(f"scales must be a 1-byte dtype (float8_e4m3fn/uint8), got {scales.dtype}")
    rows, cols = scales.shape
    rp, cp = swizzled_shape(rows, cols)
    raw = scales.view(torch.uint8)
    padded = raw.new_zeros((rp, cp))
    padded[:rows, :cols] = raw
    # [Rt, 4, 32, Ct, 4] (row = rt*128 + rb*32 + ri) -> [Rt, Ct, ri, rb, c]
    tiles = padded.reshape(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().reshape(-1).view(scales.dtype)


def from_swizzled(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of `to_swizzled`: flat swizzled scales -> [rows, cols] linear, padding dropped."""
    rp, cp = swizzled_shape(rows, cols)
    if swizzled.numel() != rp * cp:
        raise ValueError(
            f"swizzled scales for [{rows}, {cols}] must have {rp * cp} elements, got {swizzled.numel()}"
        )
    raw = swizzled.reshape(-1).view(torch.uint8)
    tiles = raw.reshape(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rp, cp)[:rows, :cols].contiguous().view(swizzled.dtype)
