"""The backward of `fp4_compile::invariant_routing` in ONE Triton launch (CUDA; CPU tensors under
TRITON_INTERPRET=1 in tests), for `fp4_compile::invariant_routing_backward`. Its torch formula
(the CPU path, the reference) ran ~16 kernels per call on the GPU (softmax, gather, sums,
zeros + scatter_add, ...); this kernel is one launch at a fraction of their time at
Qwen3-30B-A3B shapes (logits [4096, 128] FP32, top_k 8, norm_topk_prob) on the H200. The slot
loops unroll (TOP_K is a constexpr), so their scalar loads issue together.

Shape legend: M rows (tokens), E experts, k slots (top_k).

Math per row, FP32 (the CPU path's formula; every division `div_rn`, no FMA):
    p = softmax(logits row): e = exp(z - max z), p = e / S, S the pairwise tree of halves over
        BLOCK_E = next_power_of_2(E) lanes (zero padding; the forward kernel's softmax)
    sel_j = p[idx_j]                      (a masked sum with one nonzero term: exact)
    norm: T = sel_0 + sel_1 + ... in slot order, w_j = sel_j / T,
          gw = g_0 w_0 + g_1 w_1 + ... in slot order (each product rounded), g_j = (g_j - gw) / T
    dp = 0; dp[idx_j] += g_j for j = 0, 1, ..., k - 1 (duplicate ids add in slot order)
    dz = p * (dp - D), D = the same tree of halves over dp * p       -> logits' dtype
Contracts: one row per program; every sum over a row runs in an order fixed by E and k alone
(the trees by BLOCK_E, the slot sums by j), so a row's bits never depend on M or on the other
rows, and reruns are bitwise equal (no atomics). Not bitwise the CPU path (GPU exp, another
summation tree); tests bound the difference from a float64 evaluation of the formula.
Expert ids outside [0, E) (the forward never returns one) make their row NaN: checking them on
the host would be a sync per call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import check_kernel_device, compile_options, interpreting
from .routing_kernel import launch_shape

MAX_EXPERTS = 4096  # a row lives in registers (the forward routing kernel's limit too)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # logits and grad_w


@triton.jit
def _tree_sum(v, BLOCK_E: tl.constexpr, LEVELS: tl.constexpr):
    """Sum of [BLOCK_E] by a pairwise tree of halves, v[:h] + v[h:] per level (one add per
    pair, `fixed_order.tree_sum`'s tree), whatever the register layout."""
    for lvl in tl.static_range(LEVELS):
        v = tl.sum(tl.reshape(v, (2, BLOCK_E >> (lvl + 1))), axis=0)
    return tl.sum(v, axis=0)  # one element left


@triton.jit
def _selected(p, cols, i_row, j, si1):
    """(expert id of slot j, p at that id): the masked sum has one nonzero term, so it is exact."""
    ij = tl.load(i_row + j * si1)
    return ij, tl.sum(tl.where(cols == ij, p, 0.0), axis=0)


@triton.jit
def _routing_backward_kernel(
    g_ptr,
    x_ptr,
    i_ptr,
    dz_ptr,
    E,
    sg0,
    sg1,
    sx0,
    sx1,
    si0,
    si1,
    sd0,
    sd1,
    TOP_K: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_E: tl.constexpr,
    LEVELS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    live = cols < E
    z = tl.load(x_ptr + row * sx0 + cols * sx1, mask=live, other=float("-inf")).to(tl.float32)
    e = tl.where(live, tl.exp(z - tl.max(z, axis=0)), 0.0)
    p = tl.math.div_rn(e, tl.full((BLOCK_E,), 1.0, tl.float32) * _tree_sum(e, BLOCK_E, LEVELS))
    g_row = g_ptr + row * sg0
    i_row = i_ptr + row * si0
    # every sum over slots starts from slot 0's term (no identity constant)
    if NORM:
        _, total = _selected(p, cols, i_row, 0, si1)
        for j in tl.static_range(1, TOP_K):
            _, sel = _selected(p, cols, i_row, j, si1)
            total = total + sel
        _, sel = _selected(p, cols, i_row, 0, si1)
        gw = tl.load(g_row).to(tl.float32) * tl.math.div_rn(sel, total)
        for j in tl.static_range(1, TOP_K):
            _, sel = _selected(p, cols, i_row, j, si1)
            gw = gw + tl.load(g_row + j * sg1).to(tl.float32) * tl.math.div_rn(sel, total)
    dp = tl.zeros((BLOCK_E,), dtype=tl.float32)
    bad = tl.zeros((BLOCK_E,), dtype=tl.int1)
    for j in tl.static_range(TOP_K):
        ij = tl.load(i_row + j * si1)
        gj = tl.load(g_row + j * sg1).to(tl.float32)
        if NORM:
            gj = tl.math.div_rn(gj - gw, total)
        dp = dp + tl.where(cols == ij, gj, 0.0)  # dp + 0.0 elsewhere: exact
        bad = bad | (ij < 0) | (ij >= E)
    dz = p * (dp - _tree_sum(dp * p, BLOCK_E, LEVELS))
    dz = tl.where(bad, float("nan"), dz)
    tl.store(dz_ptr + row * sd0 + cols * sd1, dz.to(dz_ptr.dtype.element_ty), mask=live)


def routing_backward(
    grad_w_MK: torch.Tensor, logits_ME: torch.Tensor, idx_MK: torch.Tensor, norm_topk_prob: bool
) -> torch.Tensor:
    """d loss / d logits [M, E] in logits' dtype and layout (`torch.empty_like(logits)`, what the
    op's fake promises), from grad_w [M, k] (the routing weights' gradient) and idx int64 [M, k]
    (the forward's expert ids). All three are read through their strides (no copies). See the
    module docstring for the math and its order. Unsupported (a clear error, no fallback): other
    dtypes than float32 / bfloat16 / float16, more than MAX_EXPERTS experts."""
    check_kernel_device(logits_ME, "logits")
    for name, t in (("grad_w", grad_w_MK), ("idx", idx_MK)):
        if t.device != logits_ME.device:
            raise ValueError(f"{name} is on {t.device} but logits is on {logits_ME.device}")
    for name, t in (("logits", logits_ME), ("grad_w", grad_w_MK)):
        if t.dtype not in KERNEL_DTYPES:
            raise TypeError(
                f"{name} must have dtype in {KERNEL_DTYPES} for the routing backward kernel, "
                f"got {t.dtype}"
            )
    if idx_MK.dtype != torch.int64:
        raise TypeError(f"idx must be int64 (the forward's expert ids), got {idx_MK.dtype}")
    if logits_ME.dim() != 2:
        raise ValueError(f"logits must be [M, E], got shape {tuple(logits_ME.shape)}")
    m, num_experts = logits_ME.shape
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(
            f"logits has E={num_experts} experts; the routing backward kernel supports 1 to "
            f"{MAX_EXPERTS}"
        )
    if idx_MK.dim() != 2 or idx_MK.shape[0] != m or idx_MK.shape[1] < 1:
        raise ValueError(f"idx must be [M={m}, k >= 1], got shape {tuple(idx_MK.shape)}")
    if grad_w_MK.shape != idx_MK.shape:
        raise ValueError(
            f"grad_w must have idx's shape {tuple(idx_MK.shape)}, got {tuple(grad_w_MK.shape)}"
        )
    interp = interpreting()  # its fp32 -> 16-bit casts truncate: store FP32, torch rounds
    dz = torch.empty_like(logits_ME, dtype=torch.float32 if interp else logits_ME.dtype)
    block_e, levels, warps = launch_shape(num_experts)
    if m:
        _routing_backward_kernel[(m,)](
            grad_w_MK,
            logits_ME,
            idx_MK,
            dz,
            num_experts,
            *grad_w_MK.stride(),
            *logits_ME.stride(),
            *idx_MK.stride(),
            *dz.stride(),
            TOP_K=idx_MK.shape[1],
            NORM=bool(norm_topk_prob),
            BLOCK_E=block_e,
            LEVELS=levels,
            num_warps=warps,
            **compile_options(logits_ME.device),
        )
    return dz.to(logits_ME.dtype)
