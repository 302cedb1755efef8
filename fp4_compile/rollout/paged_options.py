"""The rollout engine's KV-cache options (`RolloutEngine(kv_cache=..., kv_tokens=...,
kv_memory_bytes=..., kv_page_size=...)`): their checks, the paged pool's size, and the refusal
of a request that could never fit (`paged_kv_cache.py` holds the cache itself)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..codegen import configs as cfgs
from ..codegen.runtime import arch_of
from .paged_kv_cache import PageAllocator, PagedKVCache, pages_for

KV_CACHES = ("static", "paged")


@dataclass(frozen=True)
class PagedOptions:
    """A paged pool of `num_pages` pages (page 0 the scratch page) of `page_size` tokens;
    `setting` names what sized it, for the errors."""

    num_pages: int
    page_size: int
    setting: str

    def check_requests(self, prompts, budgets, pages: PageAllocator) -> None:
        """Refuse, before any work, a request whose prompt and budget could not fit in the
        pool even alone (never truncated, never waiting forever)."""
        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            need = pages_for(len(prompt) + budget - 1, self.page_size)
            if need > pages.usable_pages:
                raise ValueError(
                    f"request {i} ({len(prompt)} prompt tokens + max_new_tokens {budget}) needs "
                    f"{need} KV pages of {self.page_size} tokens; the paged cache has "
                    f"{pages.usable_pages} ({self.setting}): raise it"
                )


def check_kv_cache_options(
    kv_cache: str,
    *,
    kv_tokens: int | None,
    kv_memory_bytes: int | None,
    page_size: int,
    device: torch.device,
    from_artifact: bool,
    bytes_per_token: int,
) -> PagedOptions | None:
    """None for kv_cache="static" (which takes none of the paged settings), else the pool's
    size: kv_tokens tokens (rounded up to pages), or the pages kv_memory_bytes holds (one
    setting, not both), plus the scratch page. The page size must be a multiple of the
    attention's key block on `device` (a key block never straddles two pages)."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    if kv_cache == "static":
        if kv_tokens is not None or kv_memory_bytes is not None:
            raise ValueError(
                "kv_tokens and kv_memory_bytes size a paged cache: pass kv_cache='paged'"
            )
        return None
    if from_artifact:
        raise ValueError("kv_cache='paged' needs a model engine (an artifact's step is static)")
    if (kv_tokens is None) == (kv_memory_bytes is None):
        raise ValueError(
            "kv_cache='paged' needs one of kv_tokens or kv_memory_bytes, got "
            f"kv_tokens={kv_tokens!r}, kv_memory_bytes={kv_memory_bytes!r}"
        )
    block = cfgs.pick(arch_of(device), "any", "invariant_attention", 0).block_n
    if not isinstance(page_size, int) or page_size <= 0 or page_size % block:
        raise ValueError(
            f"kv_page_size must be a positive multiple of the attention's key block {block} "
            f"on {device}, got {page_size!r}"
        )
    if kv_tokens is not None:
        if not isinstance(kv_tokens, int) or kv_tokens <= 0:
            raise ValueError(f"kv_tokens must be an int > 0, got {kv_tokens!r}")
        pages, setting = pages_for(kv_tokens, page_size), f"kv_tokens={kv_tokens}"
    else:
        if not isinstance(kv_memory_bytes, int) or kv_memory_bytes <= 0:
            raise ValueError(f"kv_memory_bytes must be an int > 0, got {kv_memory_bytes!r}")
        pages = kv_memory_bytes // (page_size * bytes_per_token) - 1
        setting = f"kv_memory_bytes={kv_memory_bytes}"
        if pages < 1:
            raise ValueError(
                f"{setting} holds no page of {page_size} tokens ({bytes_per_token} bytes per "
                "token) besides the scratch page"
            )
    return PagedOptions(num_pages=pages + 1, page_size=page_size, setting=setting)


def paged_cache(engine, opts: PagedOptions, *, rows: int, pool: PagedKVCache | None = None):
    """A paged cache of `rows` rows for `engine`: a new pool, or `pool`'s pages with its own
    block table (the engine's buckets share one pool)."""
    cache = PagedKVCache(
        num_layers=engine.num_layers if pool is None else 0,
        num_pages=opts.num_pages,
        page_size=opts.page_size,
        rows=rows,
        num_kv_heads=engine.num_kv_heads,
        head_dim=engine.head_dim,
        max_seq_len=engine.max_seq_len,
        dtype=engine.dtype,
        device=engine.device,
    )
    if pool is not None:
        cache.keys, cache.values = pool.keys, pool.values
    return cache
