"""`fp4_compile::routing_order`: the router's softmax top-k (`invariant_routing`) and the experts'
order of its slots (`expert_order`) as ONE op, for inference graphs (the rollout engine's decode:
`passes/fold_routing_order.py`); no backward (the learner's graph keeps the two ops and their
gradients).

Shape legend: T tokens, E experts, k experts per token, S = T * k slots.

routing_order(logits [T, E], top_k, norm_topk_prob, values_dtype) -> (sorted_values
values_dtype [S], perm int64 [S], offsets int32 [E], inverse int64 [S], token_index int64 [S]),
bit for bit `expert_order(experts, weights, E, values_dtype)` of `(weights, experts) =
invariant_routing(logits, top_k, norm_topk_prob)`.

CPU: the two ops' CPU references in sequence. CUDA: one Triton launch (`routing_order_kernel`:
the routing kernel's per-row code, then expert_order's kernel code) within expert_order's
one-program limits (`LAUNCH["expert_order"]`: 4096 slots, 256 experts); past them the two ops
(two launches, or expert_order's torch ops past its own limits: one program walking more
slots than that is slower than the launch it saves).
"""

from __future__ import annotations

import torch

from ..invariant import reference as invariant_reference
from ..invariant import routing  # noqa: F401  (registers invariant_routing)
from ..runtime import arch_of
from . import expert_order  # noqa: F401  (registers expert_order)
from .reference import expert_order_reference


def _check(logits: torch.Tensor, top_k: int) -> None:
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be float [T, E], got {logits.dtype} {tuple(logits.shape)}")
    if not 0 < top_k <= logits.shape[-1]:
        raise ValueError(f"top_k must be in 1..{logits.shape[-1]} (experts), got {top_k}")


@torch.library.custom_op("fp4_compile::routing_order", mutates_args=())
def routing_order(
    logits: torch.Tensor, top_k: int, norm_topk_prob: bool, values_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(logits, top_k)
    num_experts = int(logits.shape[-1])
    if logits.device.type == "cuda":
        from . import routing_order_kernel as kernel  # lazy: imports triton

        t = int(logits.shape[0])
        if kernel.fits_one_launch(t, top_k, num_experts, arch_of(logits.device)) and (
            values_dtype in kernel.KERNEL_VALUE_DTYPES
        ):
            return kernel.routing_order_triton(logits, top_k, norm_topk_prob, values_dtype)
        ops = torch.ops.fp4_compile
        weights, experts = ops.invariant_routing(logits, top_k, norm_topk_prob)
        return ops.expert_order(experts, weights, num_experts, values_dtype)
    weights, experts = invariant_reference.routing(logits, top_k, norm_topk_prob)
    out = expert_order_reference(experts, weights, num_experts, values_dtype)
    return tuple(t.contiguous() for t in out)


@routing_order.register_fake
def _(logits, top_k, norm_topk_prob, values_dtype):
    _check(logits, top_k)
    s, num_experts = logits.shape[0] * top_k, logits.shape[-1]
    longs = [logits.new_empty((s,), dtype=torch.int64) for _ in range(3)]
    offsets = logits.new_empty((num_experts,), dtype=torch.int32)
    sorted_values = logits.new_empty((s,), dtype=values_dtype)
    return sorted_values, longs[0], offsets, longs[1], longs[2]
