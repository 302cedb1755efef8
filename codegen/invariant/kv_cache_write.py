"""`fp4_compile::kv_cache_write`: a decoder layer's new keys and values stored into its static
KV cache, both in ONE launch (`fp4_compile/rollout/kv_cache.py`'s `update`).

Shape legend: B sequences, H_kv key/value heads, S_max cache slots, Tq new tokens, D head dim.

kv_cache_write(k_cache! [B, H_kv, S_max, D], v_cache! [B, H_kv, S_max, D], positions [B, Tq]
int64, k [B, H_kv, Tq, D], v [B, H_kv, Tq, D], block_table=None)   (! = written in place)

    k_cache[b, h, positions[b, t]] = k[b, h, t];  v_cache[b, h, positions[b, t]] = v[b, h, t]

Paged (`fp4_compile/rollout/paged_kv_cache.py`): block_table [B, P] int64 and the caches are
page pools [N, H_kv, PAGE, D]; position p of sequence b is slot p % PAGE of page
block_table[b, p // PAGE] (the static cache is the case page = b, PAGE = S_max).

CPU: `decode_reference.kv_cache_write` (the two `index_put_` the cache ran before). CUDA:
`kv_cache_write_kernel`, one launch for both caches; a copy, so the same bytes. A sequence's
positions are distinct (the engine's), so no slot is written twice and the order of the
stores is moot. Rollout bookkeeping, never in the learner's graph: `verify`'s normalized
census leaves it out.
"""

from __future__ import annotations

import torch

from . import decode_reference


def _check(k_cache, v_cache, positions, k, v, block_table) -> None:
    if positions.dtype != torch.int64 or positions.dim() != 2:
        raise ValueError(
            f"positions must be int64 [B, Tq], got {positions.dtype} {list(positions.shape)}"
        )
    b, tq = positions.shape
    if block_table is not None and (
        block_table.dtype != torch.int64 or block_table.dim() != 2 or block_table.shape[0] != b
    ):
        raise ValueError(
            f"block_table must be int64 [{b}, P], got {block_table.dtype} {list(block_table.shape)}"
        )
    rows = k_cache.shape[0] if block_table is not None else b  # pages, or sequences
    what = "N, H_kv, PAGE, D" if block_table is not None else f"{b}, H_kv, S_max, D"
    for name, cache in dict(k_cache=k_cache, v_cache=v_cache).items():
        if cache.dim() != 4 or cache.shape[0] != rows or cache.shape[1:] != k_cache.shape[1:]:
            raise ValueError(f"{name} must be [{what}], got {list(cache.shape)}")
    want = (b, k_cache.shape[1], tq, k_cache.shape[3])
    for name, x in dict(k=k, v=v).items():
        if tuple(x.shape) != want or x.dtype != k_cache.dtype:
            raise ValueError(
                f"{name} must be {list(want)} {k_cache.dtype}, got {list(x.shape)} {x.dtype}"
            )
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache must be {k_cache.dtype}, got {v_cache.dtype}")


@torch.library.custom_op("fp4_compile::kv_cache_write", mutates_args=("k_cache", "v_cache"))
def kv_cache_write(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_table: torch.Tensor | None = None,
) -> None:
    _check(k_cache, v_cache, positions, k, v, block_table)
    if k_cache.is_cuda:
        from .kv_cache_write_kernel import kv_cache_write as launch  # lazy: imports triton

        launch(k_cache, v_cache, positions, k, v, block_table)
    else:
        decode_reference.kv_cache_write(k_cache, v_cache, positions, k, v, block_table)


@kv_cache_write.register_fake
def _(k_cache, v_cache, positions, k, v, block_table=None):
    _check(k_cache, v_cache, positions, k, v, block_table)
