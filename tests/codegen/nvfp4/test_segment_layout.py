"""The MoE wgrad's padded token layout kernel (`codegen/nvfp4/segment_layout_kernel.py`) == its
torch-ops reference, on routings with empty experts, full and tiny segments, and more experts than
one chunk of the kernel's expert loop."""

from __future__ import annotations

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

pytest.importorskip("triton")

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def segment_layout_reference(offsets: torch.Tensor, num_tokens: int) -> dict:
    """The layout in torch ops (what the kernel replaced, and its specification)."""
    ends = offsets.to(torch.int64)
    counts = ends - torch.cat([ends.new_zeros(1), ends[:-1]])
    width = (counts + 15) // 16 * 16
    pend = torch.cumsum(width, 0)
    start = pend - width
    num_experts = ends.shape[0]
    cols = -(-(num_tokens + 15 * num_experts) // 16) * 16
    tok = torch.arange(num_tokens, device=offsets.device)
    expert = torch.searchsorted(ends, tok, right=True)
    dest = start[expert] + tok - (ends - counts)[expert]
    blocks = torch.arange(0, cols, 16, device=offsets.device)
    group = torch.searchsorted(pend, blocks, right=True).clamp_(max=num_experts - 1)
    src = torch.full((cols,), -1, dtype=torch.int64, device=offsets.device)
    src[dest] = tok
    return {
        "src": src,
        "start": start,
        "width": width,
        "cols": cols,
        "block_group": group.to(torch.int32),
    }


def _offsets(counts):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(DEV)


@pytest.mark.parametrize(
    "counts",
    [
        [10, 20, 0, 34],  # an empty expert in the middle
        [0, 0, 5],  # empty experts first
        [16, 32, 1],  # segments already 16-aligned, one of a single token
        [7],  # one expert
        [0, 0, 0],  # no tokens at all
    ],
)
def test_layout_equals_reference(counts):
    from fp4_compile.codegen.nvfp4.segment_layout_kernel import segment_layout

    offsets = _offsets(counts)
    t = sum(counts)
    got, want = segment_layout(offsets, t), segment_layout_reference(offsets, t)
    assert got["cols"] == want["cols"]
    for name in ("src", "start", "width", "block_group"):
        assert_bitwise_equal(got[name], want[name], name)


def test_many_experts_span_several_chunks():
    """300 experts (more than the kernel's 128-expert chunk), random counts with empties."""
    from fp4_compile.codegen.nvfp4.segment_layout_kernel import segment_layout

    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 9, (300,), generator=g)
    counts[torch.randint(0, 300, (60,), generator=g)] = 0
    offsets = _offsets(counts.tolist())
    t = int(counts.sum())
    got, want = segment_layout(offsets, t), segment_layout_reference(offsets, t)
    for name in ("src", "start", "width", "block_group"):
        assert_bitwise_equal(got[name], want[name], name)


def test_bad_offsets_are_refused():
    from fp4_compile.codegen.nvfp4.segment_layout_kernel import segment_layout

    with pytest.raises(ValueError, match="offsets must be int32/int64"):
        segment_layout(torch.zeros((2, 2), dtype=torch.int32, device=DEV), 4)
    with pytest.raises(ValueError, match="at least one expert"):
        segment_layout(torch.zeros((0,), dtype=torch.int32, device=DEV), 0)


def test_row_index_gives_each_columns_source_row():
    """src_rows = row_index[src] (-1 padding): the wgrad's X^T read through the MoE gather."""
    from fp4_compile.codegen.nvfp4.segment_layout_kernel import segment_layout

    counts = [10, 0, 7, 16]
    offsets = _offsets(counts)
    t = sum(counts)
    row_index = torch.randperm(t, generator=torch.Generator().manual_seed(1)).to(DEV) // 3
    got = segment_layout(offsets, t, row_index=row_index)
    src = got["src"]
    want = torch.where(src >= 0, row_index[src.clamp(min=0)], -1)
    assert_bitwise_equal(got["src_rows"], want, "src_rows")
    with pytest.raises(ValueError, match="row_index must be an integer"):
        segment_layout(offsets, t, row_index=row_index[:-1])
