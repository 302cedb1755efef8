"""`fp4_compile::gather_rows`: x[idx] for a 1-D integer index along dim 0 (the MoE experts'
`hidden_states[perm // top_k]` and `weighted_out[inv_perm]`), with a backward whose sums are
written out. Autograd of `x[idx]` is `index_put_(..., accumulate=True)`: on CUDA ATen's
sort-based `indexing_backward_kernel` (about 0.16 ms per MoE-sized call on the H200, 0.63 ms of
the learner step), on CPU a sequential loop with one rounding per add in x's dtype: two engines,
two answers.

Here the backward has one definition on every device:
  grad_x[r] = dtype(((0.0 + g[p0]) + g[p1]) + ...), p0 < p1 < ... the positions with idx[p] == r,
  each add in FP32; rows that no position names are zero.
The positions of a row are its entries of a stable sort of idx, so the order depends on the row's
own positions only: for a token, its top-k slots in expert order, whatever else is in the batch.
On CUDA (bf16, fp16, FP32) the sums are one Triton pass (`gather_rows_kernel`), bitwise these
torch ops. The forward is ATen's `x[idx]` on every engine (a copy: exact)."""

from __future__ import annotations

import torch

from .reference import gather_rows_backward_reference

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(x: torch.Tensor, idx: torch.Tensor) -> None:
    if not x.dtype.is_floating_point or x.dim() < 2:
        raise TypeError(
            f"gather_rows gathers rows of a floating tensor of >= 2 dims, got x {x.dtype} {tuple(x.shape)}"
        )
    if idx.dim() != 1 or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"gather_rows needs idx a 1-D int64 / int32 tensor, got idx {idx.dtype} {tuple(idx.shape)}"
        )


@torch.library.custom_op("fp4_compile::gather_rows", mutates_args=())
def gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    _check(x, idx)
    return x[idx].contiguous()  # the layout the fake promises, whatever x's is


@gather_rows.register_fake
def _(x, idx):
    _check(x, idx)
    return x.new_empty((idx.shape[0], *x.shape[1:]))


@torch.library.custom_op("fp4_compile::gather_rows_backward", mutates_args=())
def gather_rows_backward(grad: torch.Tensor, idx: torch.Tensor, num_rows: int) -> torch.Tensor:
    if grad.device.type == "cuda" and grad.dtype in KERNEL_DTYPES and grad.numel():
        from .gather_rows_kernel import gather_rows_backward_triton  # lazy: imports triton

        return gather_rows_backward_triton(grad, idx, num_rows)
    return gather_rows_backward_reference(grad, idx, num_rows)


@gather_rows_backward.register_fake
def _(grad, idx, num_rows):
    return grad.new_empty((num_rows, *grad.shape[1:]))


def _setup(ctx, inputs, output):
    x, idx = inputs
    ctx.save_for_backward(idx)
    ctx.num_rows = x.shape[0]


def _backward(ctx, grad):
    (idx,) = ctx.saved_tensors
    return gather_rows_backward(grad.contiguous(), idx, ctx.num_rows), None


gather_rows.register_autograd(_backward, setup_context=_setup)
