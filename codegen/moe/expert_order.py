"""`fp4_compile::expert_order`: the bookkeeping transformers' grouped experts do between the
router's top-k and the expert GEMMs, as ONE op: the stable sort of the S = T * k expert ids
(perm), the experts' group ends (offsets, int32, the grouped GEMMs' `offs`), the inverse
permutation (the top-k combine's index), each sorted row's token (perm // k) and the routing
weights in that order (cast first, then gathered). The lowering had a sort, a histogram, a
cumsum, an iota and an index_put_ plus four Inductor kernels (`passes/fold_expert_order.py`);
every result is an integer or a gathered value, exact, so the op's outputs are those tensors,
bit for bit.

Shape legend: T tokens, k experts per token, S = T * k slots, E experts.

CPU: `reference.expert_order_reference` (plain torch). CUDA: one Triton launch
(`expert_order_kernel`) up to the launch table's slots and experts (`LAUNCH["expert_order"]`);
past them the reference's torch ops (a learner micro-batch: the same integers, several
launches). Backward: sorted_values' gradient back to values (the index's backward, an exact
scatter of a permutation: grad[inverse], +0.0 for -0.0, as index_put's accumulate into zeros,
then the cast's backward); the integer outputs have none.
"""

from __future__ import annotations

import torch

from ..runtime import arch_of
from .reference import expert_order_reference


def _check(experts: torch.Tensor, values: torch.Tensor, num_experts: int) -> None:
    if experts.dim() != 2 or experts.dtype not in (torch.int32, torch.int64, torch.uint8):
        raise ValueError(f"experts must be int [T, k], got {experts.dtype} {tuple(experts.shape)}")
    if values.shape != experts.shape or not values.dtype.is_floating_point:
        raise ValueError(
            f"values must be float {tuple(experts.shape)}, got {values.dtype} {tuple(values.shape)}"
        )
    if not 0 < num_experts < 2**31:
        raise ValueError(f"num_experts must be positive, got {num_experts}")


@torch.library.custom_op("fp4_compile::expert_order", mutates_args=())
def expert_order(
    experts: torch.Tensor, values: torch.Tensor, num_experts: int, values_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """experts int [T, k] (each id in 0..E-1: the routing op's), values float [T, k] ->
    (sorted_values values_dtype [S], perm int64 [S], offsets int32 [E], inverse int64 [S],
    token_index int64 [S]). The one differentiable output comes first (opcheck's autograd test
    sums the outputs into the first one's dtype)."""
    _check(experts, values, num_experts)
    if experts.device.type == "cuda":
        from . import expert_order_kernel as kernel  # lazy: imports triton

        s = experts.numel()
        if kernel.fits_kernel(s, num_experts, arch_of(experts.device)) and (
            values.dtype in kernel.KERNEL_VALUE_DTYPES
            and values_dtype in kernel.KERNEL_VALUE_DTYPES
        ):
            return kernel.expert_order_triton(experts, values, num_experts, values_dtype)
    elif experts.numel():
        ids = experts.reshape(-1)
        if bool(((ids < 0) | (ids >= num_experts)).any()):
            raise ValueError(f"expert ids must be in 0..{num_experts - 1}")
    out = expert_order_reference(experts, values, num_experts, values_dtype)
    return tuple(t.contiguous() for t in out)


@expert_order.register_fake
def _(experts, values, num_experts, values_dtype):
    _check(experts, values, num_experts)
    s = experts.numel()
    longs = [experts.new_empty((s,), dtype=torch.int64) for _ in range(3)]
    offsets = experts.new_empty((num_experts,), dtype=torch.int32)
    sorted_values = values.new_empty((s,), dtype=values_dtype)
    return sorted_values, longs[0], offsets, longs[1], longs[2]


def _setup(ctx, inputs, output):
    _, values, _, _ = inputs
    ctx.save_for_backward(output[3])  # inverse
    ctx.values_shape = values.shape
    ctx.values_dtype = values.dtype


def _backward(ctx, grad_sorted, g_perm, g_offsets, g_inverse, g_token):
    (inverse,) = ctx.saved_tensors
    if grad_sorted is None:
        return None, None, None, None
    # index's backward: zeros.index_put_([perm], grad, accumulate=True), one term per slot
    grad = grad_sorted.index_select(0, inverse) + 0.0
    return None, grad.to(ctx.values_dtype).reshape(ctx.values_shape), None, None


expert_order.register_autograd(_backward, setup_context=_setup)
