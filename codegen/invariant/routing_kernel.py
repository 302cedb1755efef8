"""Triton kernel of `fp4_compile::invariant_routing`'s forward (Qwen3-MoE softmax top-k), and its
launcher.

Shape legend: M rows (tokens), E experts.

Invariance: one row per program; the softmax sum by a fixed pairwise tree, top-k by repeated max.
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
    """One row per program: softmax in FP32 (the row sum by an explicit pairwise tree of halves,
    the tree of `fixed_order.tree_sum`), top-k by repeated max (ties: the lower expert, as
    a stable descending sort), renormalized by the sum of the k values in order."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    live = cols < E
    z = tl.load(x_ptr + row * sx + cols, mask=live, other=float("-inf")).to(tl.float32)
    e = tl.where(live, tl.exp(z - tl.max(z, axis=0)), 0.0)
    s = e
    for lvl in tl.static_range(LEVELS):  # [2, half] rows = first / second half: s[:h] + s[h:]
        s = tl.sum(tl.reshape(s, (2, BLOCK_E >> (lvl + 1))), axis=0)
    total = tl.sum(s, axis=0)  # one element left
    p = tl.math.div_rn(e, tl.full((BLOCK_E,), 1.0, tl.float32) * total)
    q = tl.where(live, p, -1.0)
    kcols = tl.arange(0, K_P2)
    vals = tl.zeros((K_P2,), dtype=tl.float32)
    idxs = tl.zeros((K_P2,), dtype=tl.int64)
    acc = 0.0
    for j in tl.static_range(TOP_K):
        v = tl.max(q, axis=0)
        pick = tl.min(tl.where(q == v, cols, BLOCK_E), axis=0)
        vals = tl.where(kcols == j, v, vals)
        idxs = tl.where(kcols == j, pick.to(tl.int64), idxs)
        acc = acc + v  # 0.0 + v == v: the sum starts at the first value, as on the CPU
        q = tl.where(cols == pick, -2.0, q)
    if NORM:
        vals = tl.math.div_rn(vals, tl.full((K_P2,), 1.0, tl.float32) * acc)
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
