"""`fp4_compile::embedding`: the token-embedding lookup weight[ids], with an opaque backward.

The backward of an embedding is an accumulating scatter (rows of the gradient added into the
rows of their token ids, repeated tokens summed). Traced, it is whatever kernel runs it: ATen's
`embedding_dense_backward` in eager, a decomposition into `index_put(accumulate=True)` under
Inductor (ATen's sorted fallback with the backend's deterministic flag, atomic adds without).
The two sum repeated tokens differently, so a compiled model's embedding gradient differed
from the same lowered graph run eagerly on the H200
(`benchmarks/results/2026-12-04_backend_gpu_check_c695808.md`, the 2026-12-02 H200 section).
As one opaque op both paths run the same backward, with ONE definition on every device:
`gather_rows_backward`'s sums (row r of the gradient = the FP32 sum, in position order, of the
gradient rows whose id is r, rounded once to the weight's dtype; padding_idx's row zero). On
CUDA that is one Triton pass after a narrow-key sort, where ATen's CUDA
`embedding_dense_backward` takes many kernels and sums in chunks of its own
(`benchmarks/results/2026-12-04_learner_gaps_nographs_dfa63ba.md`, the 8ba281e run).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .gather_rows import gather_rows_backward


def _check(weight: torch.Tensor, ids: torch.Tensor) -> None:
    if weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise TypeError(
            f"embedding weight must be a 2-D float tensor, got {weight.dtype}{list(weight.shape)}"
        )
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"embedding ids must be int64 or int32, got {ids.dtype}")


@torch.library.custom_op("fp4_compile::embedding", mutates_args=())
def embedding(weight: torch.Tensor, ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    _check(weight, ids)
    return F.embedding(ids, weight)


@embedding.register_fake
def _(weight, ids, padding_idx):
    _check(weight, ids)
    return weight.new_empty((*ids.shape, weight.shape[1]))


@torch.library.custom_op("fp4_compile::embedding_backward", mutates_args=())
def embedding_backward(
    grad: torch.Tensor, ids: torch.Tensor, num_weights: int, padding_idx: int
) -> torch.Tensor:
    g2 = grad.reshape(-1, grad.shape[-1])
    idx = ids.reshape(-1)
    if padding_idx < 0:
        return gather_rows_backward(g2, idx, num_weights)
    # padding_idx's positions summed into one extra row, dropped (its gradient stays zero)
    idx = torch.where(idx == padding_idx, num_weights, idx)
    return gather_rows_backward(g2, idx, num_weights + 1)[:num_weights]


@embedding_backward.register_fake
def _(grad, ids, num_weights, padding_idx):
    return grad.new_empty((num_weights, grad.shape[-1]))


def _setup(ctx, inputs, output):
    weight, ids, padding_idx = inputs
    ctx.save_for_backward(ids)
    ctx.num_weights, ctx.padding_idx = weight.shape[0], padding_idx


def _backward(ctx, grad):
    (ids,) = ctx.saved_tensors
    grad_w = embedding_backward(grad.contiguous(), ids, ctx.num_weights, ctx.padding_idx)
    return grad_w, None, None


embedding.register_autograd(_backward, setup_context=_setup)
