"""`fp4_compile::expert_order`'s forward on CUDA (the interpreter in tests): ONE Triton launch,
bitwise `reference.expert_order_reference` (a stable counting sort of the expert ids).

Shape legend: S slots (= T tokens x k), E experts.

One program walks the slots in BLOCK_S chunks twice. First pass: each expert's count (a
[BLOCK_S, BLOCK_E] one-hot summed over the chunk), then offsets = their inclusive cumsum, and
each expert's first row = offsets - counts. Second pass, in slot order: a slot's row is its
expert's next free row, that is its expert's first row, plus the slots of that expert in earlier
chunks, plus those before it in its chunk (the one-hot's cumsum down the chunk): the order of a
stable sort by expert id, ties by slot. Every result is an integer, or a gathered value rounded
once (FP32 -> BF16 by integer ops: the interpreter's own cast truncates), so any chunk size gives
the same bits."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import arch_of, check_kernel_device, interpreting
from ..triton_helpers import round_bf16_keep_nan

KERNEL_VALUE_DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def expert_order_steps(
    ids_ptr,
    val_ptr,
    perm_ptr,
    offs_ptr,
    inv_ptr,
    tok_ptr,
    sval_ptr,
    S,
    E,
    K_TOP: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """The two passes over the S slots (the module doc), in the calling program: the body of
    `_expert_order_kernel` and the bookkeeping of `routing_order_kernel` (the same code)."""
    # int32 index: one program, S <= the launch table's max_slots (the launcher checks it)
    lanes = tl.arange(0, BLOCK_S)
    experts = tl.arange(0, BLOCK_E)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for start in range(0, S, BLOCK_S):
        slot = start + lanes
        ids = tl.load(ids_ptr + slot, mask=slot < S, other=-1).to(tl.int32)
        hit = (ids[:, None] == experts[None, :]).to(tl.int32)
        counts += tl.sum(hit, axis=0)
    ends = tl.cumsum(counts, axis=0)
    tl.store(offs_ptr + experts, ends, mask=experts < E)
    next_row = ends - counts  # each expert's first row
    for start in range(0, S, BLOCK_S):
        slot = start + lanes
        live = slot < S
        ids = tl.load(ids_ptr + slot, mask=live, other=-1).to(tl.int32)
        hit = (ids[:, None] == experts[None, :]).to(tl.int32)
        before = tl.cumsum(hit, axis=0) - hit  # this expert's slots before this one in the chunk
        row = tl.sum(tl.where(hit != 0, next_row[None, :] + before, 0), axis=1)
        next_row += tl.sum(hit, axis=0)
        slot64 = slot.to(tl.int64)
        tl.store(perm_ptr + row, slot64, mask=live)
        tl.store(inv_ptr + slot, row.to(tl.int64), mask=live)
        tl.store(tok_ptr + row, slot64 // K_TOP, mask=live)
        v = tl.load(val_ptr + slot, mask=live, other=0.0).to(tl.float32)
        if ROUND_BF16:
            v = round_bf16_keep_nan(v)
        tl.store(sval_ptr + row, v, mask=live)


@triton.jit
def _expert_order_kernel(
    ids_ptr,
    val_ptr,
    perm_ptr,
    offs_ptr,
    inv_ptr,
    tok_ptr,
    sval_ptr,
    S,
    E,
    K_TOP: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    expert_order_steps(
        ids_ptr,
        val_ptr,
        perm_ptr,
        offs_ptr,
        inv_ptr,
        tok_ptr,
        sval_ptr,
        S,
        E,
        K_TOP,
        ROUND_BF16,
        BLOCK_S,
        BLOCK_E,
    )


def fits_kernel(num_slots: int, num_experts: int, arch: str) -> bool:
    """Whether one `_expert_order_kernel` program takes the call (the launch table's limits)."""
    lc = pick_launch(arch, "expert_order")
    return num_slots <= lc["max_slots"] and num_experts <= lc["max_experts"]


def empty_outputs(num_slots: int, num_experts: int, values_dtype: torch.dtype, device):
    """(sorted_values, perm, offsets, inverse, token_index) to fill; sorted_values FP32 in the
    interpreter (its fp32 -> bf16 store truncates: the kernel stores the exact rounded values,
    the launcher casts them)."""
    longs = [torch.empty(num_slots, dtype=torch.int64, device=device) for _ in range(3)]
    offsets = torch.empty(num_experts, dtype=torch.int32, device=device)
    dtype = torch.float32 if interpreting() else values_dtype
    sorted_values = torch.empty(num_slots, dtype=dtype, device=device)
    return sorted_values, longs[0], offsets, longs[1], longs[2]


def expert_order_triton(experts, values, num_experts: int, values_dtype: torch.dtype):
    """-> (sorted_values, perm, offsets, inverse, token_index), as `expert_order_reference`.
    Raises for what the kernel does not take (no fallback here: the op's dispatch decides)."""
    check_kernel_device(experts, "experts")
    arch = arch_of(experts.device)
    ids = experts.reshape(-1).contiguous()
    vals = values.reshape(-1).contiguous()
    s, k = ids.shape[0], int(experts.shape[-1])
    if not fits_kernel(s, num_experts, arch):
        raise ValueError(f"expert_order kernel: {s} slots x {num_experts} experts past its limits")
    if values.dtype not in KERNEL_VALUE_DTYPES or values_dtype not in KERNEL_VALUE_DTYPES:
        raise ValueError(
            f"expert_order kernel: values {values.dtype} -> {values_dtype} not in "
            f"{KERNEL_VALUE_DTYPES}"
        )
    sorted_values, perm, offsets, inverse, token_index = empty_outputs(
        s, num_experts, values_dtype, experts.device
    )
    lc = pick_launch(arch, "expert_order")
    _expert_order_kernel[(1,)](
        ids,
        vals,
        perm,
        offsets,
        inverse,
        token_index,
        sorted_values,
        s,
        num_experts,
        K_TOP=k,
        ROUND_BF16=values_dtype == torch.bfloat16,
        BLOCK_S=lc["block_s"],
        BLOCK_E=max(triton.next_power_of_2(num_experts), 2),
        **warps_kwargs(lc),
    )
    return sorted_values.to(values_dtype), perm, offsets, inverse, token_index
