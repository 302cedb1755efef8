"""Triton kernel of `fp4_compile::kv_cache_write` (a layer's new keys and values stored into
its static KV cache), and its launcher.

Shape legend: B sequences, H_kv key/value heads, S_max cache slots, Tq new tokens, D head dim.

One program per (b, h, t) row, BLOCK_D = pow2(D) lanes: the row's slot positions[b, t], then
k[b, h, t] copied to k_cache[b, h, slot] and v[b, h, t] to v_cache[b, h, slot]. A copy: the
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
    H,
    TQ,
    S,
    D,
    sp_b,
    sp_t,
    sk_b,
    sk_h,
    sk_t,
    sk_d,
    sv_b,
    sv_h,
    sv_t,
    sv_d,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # (b * H + h) * TQ + t
    t = row % TQ
    bh = row // TQ
    b = bh // H
    h = bh % H
    slot = tl.load(positions_ptr + b * sp_b + t * sp_t)
    cols = tl.arange(0, BLOCK_D)
    live = cols < D
    dst = (bh * S + slot) * D + cols  # the caches are contiguous [B, H, S, D]
    k = tl.load(k_ptr + b * sk_b + h * sk_h + t * sk_t + cols * sk_d, mask=live)
    tl.store(k_cache_ptr + dst, k, mask=live)
    v = tl.load(v_ptr + b * sv_b + h * sv_h + t * sv_t + cols * sv_d, mask=live)
    tl.store(v_cache_ptr + dst, v, mask=live)


def kv_cache_write(k_cache, v_cache, positions, k, v) -> None:
    """`decode_reference.kv_cache_write` in one launch (arguments checked by the op; the caches
    contiguous, as the engine's are; positions, k and v read through their strides)."""
    target = kernel_target(k_cache, "k_cache")
    for name, t in dict(k_cache=k_cache, v_cache=v_cache).items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    b, h, s, d = k_cache.shape
    tq = positions.shape[1]
    lc = pick_launch(target.arch, "kv_cache_write")
    if b * h * tq:
        _kv_cache_write_kernel[(b * h * tq,)](
            k_cache,
            v_cache,
            positions,
            k,
            v,
            h,
            tq,
            s,
            d,
            *positions.stride(),
            *k.stride(),
            *v.stride(),
            BLOCK_D=triton.next_power_of_2(d),
            **warps_kwargs(lc),
        )
