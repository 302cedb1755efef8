"""`fp4_compile::gather_kv_pages`: a paged KV cache's layer read as the contiguous cache.

Shape legend: N pages in the pool, Hkv key/value heads, PAGE slots per page, D head dim,
B sequences, P pages per sequence (the block table's width).

A paged cache holds each layer's keys (and values) in a pool [N, Hkv, PAGE, D]; sequence b's
key j lives in page block_table[b, j // PAGE], slot j % PAGE (`fp4_compile/rollout/
paged_kv_cache.py`). gather_kv_pages(pool, block_table) is that layer as the static cache lays it
out, [B, Hkv, P * PAGE, D]: what transformers' attention reads. It is a copy; the lowering never
runs it: `passes/lower_attention.py` hands the pool and the block table to
`fp4_compile::invariant_attention` instead (its kernel reads the pages in place; its CPU path
gathers with `gather_pages`, the same values).
"""

from __future__ import annotations

import torch


def gather_pages(pool_NHPD: torch.Tensor, block_table_BP: torch.Tensor) -> torch.Tensor:
    """[B, Hkv, P * PAGE, D]: key j of sequence b = pool[block_table[b, j // PAGE], :, j % PAGE]."""
    b, p = block_table_BP.shape
    _, h, page, d = pool_NHPD.shape
    pages = pool_NHPD[block_table_BP.long()]  # [B, P, Hkv, PAGE, D]
    return pages.permute(0, 2, 1, 3, 4).reshape(b, h, p * page, d)


@torch.library.custom_op("fp4_compile::gather_kv_pages", mutates_args=())
def gather_kv_pages(pool: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    return gather_pages(pool, block_table)


@gather_kv_pages.register_fake
def _(pool, block_table):
    b, p = block_table.shape
    _, h, page, d = pool.shape
    return pool.new_empty((b, h, p * page, d))
