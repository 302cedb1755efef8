"""Triton kernel of `fp4_compile::invariant_routing`'s forward (Qwen3-MoE softmax top-k), and its
launcher.

Shape legend: M rows (tokens), E experts.

Invariance: one row per program; the softmax sum by a fixed pairwise tree, top-k by repeated max
(`route_rows`, the routing step `moe/routing_order_kernel.py` runs too).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch
from ..runtime import check_kernel_device


def launch_shape(num_experts: int) -> tuple[int, int, int]:
    """(BLOCK_E, tree levels, warps) of the routing kernels (forward and backward): a function
    of E only (no autotuning, nothing from M); `configs.LAUNCH`'s "routing" row."""
    lc = pick_launch("any", "routing")
    block_e = max(triton.next_power_of_2(num_experts), 2)
    warps = lc["small_num_warps"] if block_e <= lc["small_block_e"] else lc["num_warps"]
    return block_e, block_e.bit_length() - 1, warps


@triton.jit
def route_rows(
    x_RE,
    live_E,
    TOP_K: tl.constexpr,
    K_P2: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_E: tl.constexpr,
    LEVELS: tl.constexpr,
):
    """The routing of R rows x_RE [R, BLOCK_E] (logits as loaded, lanes past E masked to -inf;
    live_E [BLOCK_E] = lane < E) -> (weights FP32 [R, K_P2], experts int64 [R, K_P2]): softmax
    in FP32 (the row sum by an explicit pairwise tree of halves, the tree of
    `fixed_order.tree_sum`), top-k by repeated max (ties: the lower expert, as a stable
    descending sort), renormalized by the sum of the k values in order. Every reduction is a max,
    a min or a sum of two lanes (exact, any layout), so a row's bits do not depend on R: the one
    routing step of `_routing_kernel` and `moe/routing_order_kernel` (the same code)."""
    cols = tl.arange(0, BLOCK_E)
    live = live_E[None, :]
    z = x_RE.to(tl.float32)
    e = tl.where(live, tl.exp(z - tl.max(z, axis=1)[:, None]), 0.0)
    s = e
    for lvl in tl.static_range(LEVELS):  # [R, 2, half]: first / second half, s[:h] + s[h:]
        s = tl.sum(tl.reshape(s, (x_RE.shape[0], 2, BLOCK_E >> (lvl + 1))), axis=1)
    total = tl.sum(s, axis=1)  # one element left per row
    p = tl.math.div_rn(e, tl.full(x_RE.shape, 1.0, tl.float32) * total[:, None])
    q = tl.where(live, p, -1.0)
    kcols = tl.arange(0, K_P2)[None, :]
    vals = tl.zeros((x_RE.shape[0], K_P2), dtype=tl.float32)
    idxs = tl.zeros((x_RE.shape[0], K_P2), dtype=tl.int64)
    acc = tl.zeros((x_RE.shape[0],), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        v = tl.max(q, axis=1)
        pick = tl.min(tl.where(q == v[:, None], cols[None, :], BLOCK_E), axis=1)
        vals = tl.where(kcols == j, v[:, None], vals)
        idxs = tl.where(kcols == j, pick[:, None].to(tl.int64), idxs)
        acc = acc + v  # 0.0 + v == v: the sum starts at the first value, as on the CPU
        q = tl.where(cols[None, :] == pick[:, None], -2.0, q)
    if NORM:
        vals = tl.math.div_rn(vals, tl.full((x_RE.shape[0], K_P2), 1.0, tl.float32) * acc[:, None])
    return vals, idxs


@triton.jit
def _routing_kernel(
    x_ptr,
    w_ptr,
    i_ptr,
    E,
    sx,
    TOP_K: tl.constexpr,
    K_P2: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_E: tl.constexpr,
    LEVELS: tl.constexpr,
):
    """One row per program: `route_rows` on a [1, BLOCK_E] tile."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    live = cols < E
    z = tl.load(x_ptr + row * sx + cols[None, :], mask=live[None, :], other=float("-inf"))
    vals, idxs = route_rows(z, live, TOP_K, K_P2, NORM, BLOCK_E, LEVELS)
    kcols = tl.arange(0, K_P2)[None, :]
    kmask = kcols < TOP_K
    tl.store(w_ptr + row * TOP_K + kcols, vals, mask=kmask)
    tl.store(i_ptr + row * TOP_K + kcols, idxs, mask=kmask)


def routing(logits_ME, top_k: int, norm_topk_prob: bool):
    """Qwen3-MoE routing in ONE launch (the torch construction of `reference.routing` was
    ~50 launches, about 1 ms of host time per call on the H200). Same definition, GPU exp:
    softmax(float32 logits), stable top-k, optional renormalization. -> (weights FP32 [M, k],
    experts int64 [M, k])."""
    check_kernel_device(logits_ME, "logits")
    m, num_experts = logits_ME.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..{num_experts} (experts), got {top_k}")
    if num_experts > 4096:
        raise ValueError(f"routing kernel supports up to 4096 experts, got {num_experts}")
    x = logits_ME if logits_ME.stride(1) == 1 else logits_ME.contiguous()
    w = torch.empty((m, top_k), dtype=torch.float32, device=x.device)
    idx = torch.empty((m, top_k), dtype=torch.int64, device=x.device)
    block_e, levels, warps = launch_shape(num_experts)
    if m:
        _routing_kernel[(m,)](
            x,
            w,
            idx,
            num_experts,
            x.stride(0),
            TOP_K=top_k,
            K_P2=max(triton.next_power_of_2(top_k), 2),
            NORM=bool(norm_topk_prob),
            BLOCK_E=block_e,
            LEVELS=levels,
            num_warps=warps,
        )
    return w, idx
