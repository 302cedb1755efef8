"""Triton kernel of `fp4_compile::kv_cache_write` (a layer's new keys and values stored into
its static KV cache), and its launcher.

Shape legend: B sequences, H_kv key/value heads, S_max cache slots, Tq new tokens, D head dim.

One program per (b, h, t) row, BLOCK_D = pow2(D) lanes: the row's position p = positions[b, t],
then k[b, h, t] copied to k_cache[b, h, p] and v[b, h, t] to v_cache[b, h, p]; paged
(HAS_TABLE), to [block_table[b, p // PAGE], h, p % PAGE] of the page pools. A copy: the
bytes of the two `index_put_` it replaces. k and v are read through their strides (the value
states are a transposed view of the v GEMM's output: no contiguous copy first).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import kernel_target


@triton.jit
def _kv_cache_write_kernel(
    k_cache_ptr,
    v_cache_ptr,
    positions_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    H,
    TQ,
    S,
    D,
    sp_b,
    sp_t,
    st_b,
    st_p,
    sk_b,
    sk_h,
    sk_t,
    sk_d,
    sv_b,
    sv_h,
    sv_t,
    sv_d,
    BLOCK_D: tl.constexpr,
    HAS_TABLE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # (b * H + h) * TQ + t
    t = row % TQ
    bh = row // TQ
    b = bh // H
    h = bh % H
    pos = tl.load(positions_ptr + b * sp_b + t * sp_t)
    if HAS_TABLE:  # S is the page size; the caches are contiguous page pools [N, H, S, D]
        page = tl.load(table_ptr + b * st_b + (pos // S) * st_p)
        slot = pos % S
    else:  # the caches are contiguous [B, H, S, D]: sequence b is "page" b
        page = b
        slot = pos
    cols = tl.arange(0, BLOCK_D)
    live = cols < D
    dst = ((page * H + h) * S + slot) * D + cols
    k = tl.load(k_ptr + b * sk_b + h * sk_h + t * sk_t + cols * sk_d, mask=live)
    tl.store(k_cache_ptr + dst, k, mask=live)
    v = tl.load(v_ptr + b * sv_b + h * sv_h + t * sv_t + cols * sv_d, mask=live)
    tl.store(v_cache_ptr + dst, v, mask=live)


def kv_cache_write(k_cache, v_cache, positions, k, v, block_table=None) -> None:
    """`decode_reference.kv_cache_write` in one launch (arguments checked by the op; the caches
    contiguous, as the engine's are; positions, k, v and the block table read through their
    strides)."""
    target = kernel_target(k_cache, "k_cache")
    for name, t in dict(k_cache=k_cache, v_cache=v_cache).items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    _, h, s, d = k_cache.shape
    b, tq = positions.shape
    table = positions if block_table is None else block_table  # a placeholder when static
    lc = pick_launch(target.arch, "kv_cache_write")
    if b * h * tq:
        _kv_cache_write_kernel[(b * h * tq,)](
            k_cache,
            v_cache,
            positions,
            k,
            v,
            table,
            h,
            tq,
            s,
            d,
            *positions.stride(),
            *table.stride(),
            *k.stride(),
            *v.stride(),
            BLOCK_D=triton.next_power_of_2(d),
            HAS_TABLE=block_table is not None,
            **warps_kwargs(lc),
        )
