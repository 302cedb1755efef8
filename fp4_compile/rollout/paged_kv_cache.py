"""A paged KV cache for the rollout engine: KV memory sized in tokens, not batch x max_seq_len.

Shape legend: N pages in the pool, H_kv key/value heads, PAGE slots per page, D head dim,
B rows (slots) of the batch bucket, P = ceil(max_seq_len / PAGE) pages per row, Tq new tokens.

Each layer's keys (and values) live in one pool [N, H_kv, PAGE, D]; a row's block table
[B, P] names its pages in order, so its key j sits in page block_table[b, j // PAGE], slot
j % PAGE. Laid out through the table, a row's keys are exactly the static cache's row
(`kv_cache.StaticKVCache`): positions from 0, never left-padded. PAGE is a multiple of the
invariant attention's key block (BLOCK_N), so the attention kernel walks each row's keys in the
same fixed blocks from key 0, in the same order, reading them from their pages in place
(`fp4_compile::invariant_attention`'s block_table; DESIGN.md, alignment rule 4): a request's
bits are the static cache's, and the learner's.

Page 0 is the scratch page: every table entry that names no page of the row's request points
to it. Idle (finished, frozen) rows write their recomputed last step there, and reads through
it are of keys the mask hides (finite values, exact no-ops of the softmax). The device side
(`PagedKVCache`: pools, table, the in-place write) and the host side (`PageAllocator`: free
pages, each row's pages) are separate; the engine's `_Slots` grows, preempts and frees rows
through the allocator at its periodic host check.
"""

from __future__ import annotations

import torch

from ..codegen.invariant.kv_pages import gather_kv_pages
from .kv_cache import TransformersCacheQueries

SCRATCH_PAGE = 0


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold `tokens` positions from 0."""
    return -(-tokens // page_size)


class PagedKVCache(TransformersCacheQueries):
    """Page pools [N, H_kv, PAGE, D] per layer and a block table [B, P] (int64); duck-types
    transformers' Cache like `StaticKVCache`, whose write contract it keeps: `update` writes the
    new [B, H_kv, Tq, D] keys and values with `fp4_compile::kv_cache_write` through the block
    table (one launch on CUDA, in place on a graph input: no copy of a pool,
    `tests/rollout/test_kv_cache_write.py`) and returns each layer as the contiguous
    layout, `fp4_compile::gather_kv_pages(pool, table)`, which the lowering folds into the
    attention op (the kernel reads the pages; nothing is gathered)."""

    is_compileable = True

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        rows: int,
        num_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (num_pages, num_kv_heads, page_size, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        width = pages_for(max_seq_len, page_size)
        self.block_table = torch.full((rows, width), SCRATCH_PAGE, dtype=torch.int64, device=device)
        self.write_positions = None

    @classmethod
    def from_tensors(
        cls, keys: list[torch.Tensor], values: list[torch.Tensor], block_table: torch.Tensor
    ) -> PagedKVCache:
        """Wrap existing pools and a block table (the compiled step receives them as inputs)."""
        cache = cls.__new__(cls)
        cache.keys, cache.values, cache.block_table = keys, values, block_table
        cache.write_positions = None
        return cache

    @property
    def page_size(self) -> int:
        return self.keys[0].shape[2]

    @property
    def num_pages(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_seq_len(self) -> int:
        """Key slots a row addresses: the table's width in pages x PAGE."""
        return self.block_table.shape[1] * self.page_size

    @property
    def write_positions(self) -> torch.Tensor | None:
        """[B, Tq] int64: where this forward's new tokens go, set before each forward."""
        return self._write_positions

    @write_positions.setter
    def write_positions(self, positions_BT: torch.Tensor | None) -> None:
        self._write_positions = positions_BT

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ):
        """Write [B, H_kv, Tq, D] at the rows' positions (page block_table[b, p // PAGE], slot
        p % PAGE); return the layer as [B, H_kv, S, D]. A row's positions are distinct and its
        pages its own, so no slot is written twice (idle rows all write the scratch page, which
        no visible key reads)."""
        positions = self._write_positions
        assert positions is not None, "set write_positions before the forward"
        table = self.block_table
        torch.ops.fp4_compile.kv_cache_write(
            self.keys[layer_idx], self.values[layer_idx], positions, key_states, value_states, table
        )
        return (
            gather_kv_pages(self.keys[layer_idx], table),
            gather_kv_pages(self.values[layer_idx], table),
        )


class PageAllocator:
    """The host side of a `PagedKVCache`: the free pages and each row's pages, in order. It
    keeps a host copy of the block table and writes it to the device table in place
    (`flush`: one copy, at the engine's host checks), so a captured decode graph reads it."""

    def __init__(self, cache: PagedKVCache):
        self.cache = cache
        self.page_size = cache.page_size
        self.usable_pages = cache.num_pages - 1  # page 0: scratch
        self.free = list(range(cache.num_pages - 1, SCRATCH_PAGE, -1))  # pop(): lowest first
        self.owned: list[list[int]] = [[] for _ in range(cache.block_table.shape[0])]
        self.table = torch.full(tuple(cache.block_table.shape), SCRATCH_PAGE, dtype=torch.int64)
        self.dirty = True

    def pages_for(self, tokens: int) -> int:
        return pages_for(tokens, self.page_size)

    def can_grow(self, row: int, tokens: int) -> bool:
        """Whether row can hold `tokens` positions from 0 with the free pages."""
        return self.pages_for(tokens) - len(self.owned[row]) <= len(self.free)

    def grow(self, row: int, tokens: int) -> None:
        """Give row the pages for `tokens` positions from 0 (the caller checked `can_grow`);
        tokens past the table's width are capped (a row never writes there)."""
        need = min(self.pages_for(tokens), self.table.shape[1])
        have = self.owned[row]
        while len(have) < need:
            page = self.free.pop()
            self.table[row, len(have)] = page
            have.append(page)
            self.dirty = True

    def release(self, row: int) -> None:
        """Free row's pages; its table entries name the scratch page again."""
        if self.owned[row]:
            self.free.extend(reversed(self.owned[row]))
            self.free.sort(reverse=True)
            self.owned[row] = []
            self.table[row] = SCRATCH_PAGE
            self.dirty = True

    def release_all(self) -> None:
        for row in range(len(self.owned)):
            self.release(row)

    def flush(self) -> None:
        """The host table onto the device table, in place (only when it changed)."""
        if self.dirty:
            self.cache.block_table.copy_(self.table)
            self.dirty = False
