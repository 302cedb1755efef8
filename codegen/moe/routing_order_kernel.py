"""`fp4_compile::routing_order`'s forward on CUDA (the interpreter in tests): the routing of the
T tokens and the experts' order of their S = T x k slots in ONE launch, bitwise
`invariant_routing` followed by `expert_order`.

Shape legend: T tokens, E experts, k experts per token, S = T x k slots.

One program. First, the routing, block_t rows at a time, by `routing_kernel.route_rows` (the
code `invariant_routing`'s kernel runs: the same bits per row), into the slots' weights and ids
(scratch in global memory). A barrier: the second step reads slots other threads of the program
wrote. Then `expert_order_kernel.expert_order_steps` (the code `expert_order`'s kernel runs) over
those slots: counts, offsets, each slot's row, the sorted weights."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..invariant.routing_kernel import launch_shape, route_rows
from ..runtime import arch_of, check_kernel_device
from .expert_order_kernel import KERNEL_VALUE_DTYPES, empty_outputs, expert_order_steps, fits_kernel


@triton.jit
def _routing_order_kernel(
    x_ptr,
    w_ptr,
    i_ptr,
    perm_ptr,
    offs_ptr,
    inv_ptr,
    tok_ptr,
    sval_ptr,
    T,
    E,
    sx,
    TOP_K: tl.constexpr,
    K_P2: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_E: tl.constexpr,
    LEVELS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_E)
    live = cols < E
    kcols = tl.arange(0, K_P2)[None, :]
    for start in range(0, T, BLOCK_T):
        rows = start + tl.arange(0, BLOCK_T).to(tl.int64)
        # rows past T read the last row (no -inf rows, no NaN); their results are not stored
        src = tl.minimum(rows, T - 1)
        z = tl.load(
            x_ptr + src[:, None] * sx + cols[None, :], mask=live[None, :], other=float("-inf")
        )
        vals, idxs = route_rows(z, live, TOP_K, K_P2, NORM, BLOCK_E, LEVELS)
        slot = rows[:, None] * TOP_K + kcols
        keep = (rows[:, None] < T) & (kcols < TOP_K)
        tl.store(w_ptr + slot, vals, mask=keep)
        tl.store(i_ptr + slot, idxs, mask=keep)
    tl.debug_barrier()  # every slot written above is read below, by other threads of this program
    expert_order_steps(
        i_ptr,
        w_ptr,
        perm_ptr,
        offs_ptr,
        inv_ptr,
        tok_ptr,
        sval_ptr,
        T * TOP_K,
        E,
        TOP_K,
        ROUND_BF16,
        BLOCK_S,
        BLOCK_E,
    )


def fits_one_launch(num_tokens: int, top_k: int, num_experts: int, arch: str) -> bool:
    """Whether the call runs as one launch: within expert_order's one-program limits (slots,
    experts; the routing kernel's 4096 experts are above them)."""
    return fits_kernel(num_tokens * top_k, num_experts, arch)


def routing_order_triton(logits_TE, top_k: int, norm_topk_prob: bool, values_dtype: torch.dtype):
    """-> (sorted_values [S], perm [S], offsets int32 [E], inverse [S], token_index [S]), as
    `expert_order(*reversed(invariant_routing(logits, top_k, norm)), E, values_dtype)`. Raises
    for what one launch does not take (the op's dispatch runs the two ops there)."""
    check_kernel_device(logits_TE, "logits")
    arch = arch_of(logits_TE.device)
    t, num_experts = logits_TE.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..{num_experts} (experts), got {top_k}")
    if not fits_one_launch(t, top_k, num_experts, arch) or values_dtype not in KERNEL_VALUE_DTYPES:
        raise ValueError(
            f"routing_order kernel: {t} tokens x top-{top_k} of {num_experts} experts -> "
            f"{values_dtype} past its limits"
        )
    x = logits_TE if logits_TE.stride(1) == 1 else logits_TE.contiguous()
    s, dev = t * top_k, x.device
    weights = torch.empty(s, dtype=torch.float32, device=dev)  # the routing's, slot order
    experts = torch.empty(s, dtype=torch.int64, device=dev)
    out = empty_outputs(s, num_experts, values_dtype, dev)
    block_e, levels, _ = launch_shape(num_experts)
    lc = pick_launch(arch, "routing_order")
    _routing_order_kernel[(1,)](
        x,
        weights,
        experts,
        out[1],
        out[2],
        out[3],
        out[4],
        out[0],
        t,
        num_experts,
        x.stride(0),
        TOP_K=top_k,
        K_P2=max(triton.next_power_of_2(top_k), 2),
        NORM=bool(norm_topk_prob),
        BLOCK_E=block_e,
        LEVELS=levels,
        BLOCK_T=lc["block_t"],
        ROUND_BF16=values_dtype == torch.bfloat16,
        BLOCK_S=pick_launch(arch, "expert_order")["block_s"],
        **warps_kwargs(lc),
    )
    return (out[0].to(values_dtype), *out[1:])
