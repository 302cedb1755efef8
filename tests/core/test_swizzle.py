"""Swizzled 128x4 block-scale layout: the documented byte offsets, and lossless round trips."""

import pytest
import torch

from fp4_compile import from_swizzled, to_swizzled
from fp4_compile.swizzle import swizzled_shape


def test_offsets_match_the_formula():
    rows, cols = 128, 4
    vals = torch.arange(rows * cols, dtype=torch.int32).reshape(rows, cols)
    lin = (vals % 251).to(torch.uint8)
    swz = to_swizzled(lin)
    for r in range(rows):
        for c in range(cols):
            assert swz[(r % 32) * 16 + (r // 32) * 4 + c] == lin[r, c]


def test_tiles_are_row_major_over_tiles():
    lin = torch.zeros(256, 8, dtype=torch.uint8)
    lin[128, 4] = 7  # tile (1, 1) -> 4th tile (index 3), local (0, 0)
    swz = to_swizzled(lin)
    assert swz[3 * 512] == 7 and int(swz.sum()) == 7


@pytest.mark.parametrize("rows, cols", [(1, 1), (130, 5), (256, 8), (300, 17)])
def test_round_trip_with_padding(rows, cols):
    g = torch.Generator().manual_seed(rows)
    lin = torch.randint(0, 0x7F, (rows, cols), generator=g, dtype=torch.uint8).view(
        torch.float8_e4m3fn
    )
    swz = to_swizzled(lin)
    rp, cp = swizzled_shape(rows, cols)
    assert swz.numel() == rp * cp and swz.dtype == torch.float8_e4m3fn
    assert torch.equal(from_swizzled(swz, rows, cols).view(torch.uint8), lin.view(torch.uint8))
    padding = swz.view(torch.uint8).sum() - lin.view(torch.uint8).sum()
    assert int(padding) == 0  # zeros in the padding


def test_bad_inputs():
    with pytest.raises(ValueError, match="2D"):
        to_swizzled(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(TypeError, match="1-byte"):
        to_swizzled(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="must have 512 elements"):
        from_swizzled(torch.zeros(10, dtype=torch.uint8), 4, 4)
