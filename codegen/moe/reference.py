"""CPU references of the MoE glue ops (plain PyTorch, no Triton): each op's CPU implementation
and the bits its CUDA kernel must reproduce.

Shape legend: S = T * k slots (the experts' rows sorted by expert), H hidden, T tokens,
k experts per token, E experts, K in-features, N out-features.

- `moe_combine_reference`: row_scale, gather_rows and ordered_sum composed, in that order: each
  slot's product x[p] * w[p] rounded to promote(x, w), then summed over a token's k slots in
  slot order from slot 0's value, every partial sum rounded to that dtype.
- `slot_grad_sums_reference`: the gradient of row_scale's output, `gather_rows`' backward
  (a position-ordered FP32 sum) of the expanded token gradient.
- `row_scale_backward_reference`: grad_x = grad * w rounded to x's dtype; grad_w = the FP32
  products grad * x summed over H by `fixed_order.block_sum` in blocks of `ROW_SCALE_BLOCK`
  (a fixed tree order, whatever the batch), rounded to w's dtype.
- `grouped_mm_reference`: per expert, `invariant_linear` of its rows (so every row's bits are
  its own and its expert weight's).
- `expert_order_reference`: the routing's sort, counts, offsets, inverse and sorted weights
  (integers and one gather: exact).
"""

from __future__ import annotations

import torch

from ..invariant import fixed_order as im
from ..invariant.ordered_sum import ordered_sum_torch
from ..invariant.reference import gather_rows_backward_reference

ROW_SCALE_BLOCK = 64  # columns per block of row_scale's grad_w sum (part of its bits)


def rows_zeroed(x, row_mask):
    """x with the rows where `row_mask` (bool [S] / [S, 1]) is true set to zero (or x itself)."""
    return x if row_mask is None else x.masked_fill(row_mask.reshape(-1, 1), 0.0)


def moe_combine_reference(x, w, idx, k, row_mask=None):
    """The forward as the composition of the four ops' CPU implementations (on
    `x.masked_fill(row_mask, 0)` where a row mask is given)."""
    x = rows_zeroed(x, row_mask)
    y = (x * w)[idx]  # row_scale, then gather_rows (x[idx]: negatives wrap)
    return ordered_sum_torch(y.reshape(x.shape[0] // k, k, x.shape[1]), 1, False)


def slot_grad_sums_reference(grad: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """The gradient of row_scale's output: `gather_rows` backward of the expanded grad."""
    t, h = grad.shape
    expanded = grad.unsqueeze(1).expand(t, k, h).reshape(t * k, h)
    return gather_rows_backward_reference(expanded, idx, t * k)


def row_scale_backward_reference(grad, x, w, row_mask=None):
    """The backward's math as torch ops (the CPU implementation; the kernel's reference). With
    `row_mask` (bool, x.shape[:-1] or [.., 1]): the backward of row_scale(x.masked_fill(m, 0),
    w) through the masked_fill (masked rows: x read as zeros, grad_x +0.0)."""
    col = None if row_mask is None else row_mask.reshape(*x.shape[:-1], 1)
    if col is not None:
        x = x.masked_fill(col, 0.0)
    grad_x = (grad * w).to(x.dtype)
    if col is not None:
        grad_x = grad_x.masked_fill(col, 0.0)
    prod = grad.to(torch.float32) * x.to(torch.float32)
    grad_w = im.block_sum(prod, ROW_SCALE_BLOCK)[..., None].to(w.dtype)
    return grad_x, grad_w


def expert_groups(offsets: torch.Tensor):
    """(expert, first row, end row) of each expert's rows, from int32 group-end offsets."""
    start = 0
    for e, end in enumerate(offsets.tolist()):
        yield e, start, end
        start = end


def grouped_mm_reference(x_TK, w_ENK, offsets, out_dtype):
    """The BF16 experts' GEMM: each expert's rows through `invariant_linear` (its reference)."""
    out = x_TK.new_zeros((x_TK.shape[0], w_ENK.shape[1]), dtype=out_dtype)
    for e, start, end in expert_groups(offsets):
        if end > start:
            out[start:end] = torch.ops.fp4_compile.invariant_linear(
                x_TK[start:end], w_ENK[e], None, out_dtype
            )
    return out


def expert_order_reference(experts, values, num_experts: int, values_dtype: torch.dtype):
    """The bookkeeping of transformers' grouped experts between the router and the GEMMs, as
    plain torch ops (the CPU implementation of `fp4_compile::expert_order`, and its CUDA path
    past the kernel's limits). experts: int [T, k] expert ids, each in 0..E-1; values: [T, k]
    routing weights. Returns, all exact (a gather after one cast, or integers):
    - sorted_values [S] values_dtype: values.to(values_dtype).reshape(-1)[perm] (one rounding,
      the cast's; the gather is exact);
    - perm int64 [S]: the slots (t * k + j) sorted by expert id, stable (ties: the lower slot);
    - offsets int32 [E]: the end of each expert's rows in that order (cumsum of the counts);
    - inverse int64 [S]: inverse[perm[r]] = r;
    - token_index int64 [S]: perm // k, the token of each sorted row."""
    ids = experts.reshape(-1)
    s = ids.shape[0]
    # the keys as uint8 / int16 where the ids fit: a stable sort's order is the keys' order, so
    # the same perm, and on CUDA 1-2 radix passes instead of 8 (`narrow_expert_sort_keys`)
    narrow = torch.uint8 if num_experts <= 256 else torch.int16 if num_experts <= 32767 else None
    perm = torch.sort(ids if narrow is None else ids.to(narrow), stable=True).indices
    sorted_ids = ids[perm]
    experts_E = torch.arange(num_experts, dtype=sorted_ids.dtype, device=ids.device)
    # the end of expert e's rows: how many ids are <= e (no atomics: the same on every device)
    offsets = torch.searchsorted(sorted_ids, experts_E, right=True, out_int32=True)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(s, dtype=perm.dtype, device=perm.device)
    token_index = torch.div(perm, experts.shape[-1], rounding_mode="floor")
    sorted_values = values.to(values_dtype).reshape(-1)[perm]
    return sorted_values, perm, offsets, inverse, token_index
