"""`fp4_compile::invariant_attention_mask_args`: what the attention kernels read of a boolean
mask, made once per graph for every attention that shares the mask (every decoder layer's).

Shape legend: mb, mh the mask's batch and head extents (1 on a broadcast dim), Tq queries, Tk key
slots; a mask row is one (sequence, head, query): rows = mb * mh * Tq.

- invariant_attention_mask_args(mask, tq, tk) -> (words, intervals, flag), int32: words
  [rows, ceil(Tk / 32)] (bit i of word w = key 32 w + i), intervals [rows, 2] (each row's
  [first visible key, last + 1)), flag [1] (1 iff every row sees exactly its interval).
`passes/targets.py`'s `emit_attention` inserts it once per (mask, Tq, Tk) and hands the three
tensors to `fp4_compile::invariant_attention` (and, saved by autograd, its backward), whose CUDA
path reads them instead of preparing the mask in every call; the CPU attention reads the mask
itself. Integers only: no numerics of its own. Not differentiable (a boolean mask).
CPU: `invariant/reference.attention_mask_args`. CUDA: `attention_masks.prepare_mask` (a
`torch.ones` flag and one Triton launch, imported lazily).
"""

from __future__ import annotations

import torch

from . import reference as cpu

_LIB = "fp4_compile"


@torch.library.custom_op(f"{_LIB}::invariant_attention_mask_args", mutates_args=())
def invariant_attention_mask_args(
    mask: torch.Tensor, tq: int, tk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if mask.dtype != torch.bool or not 1 <= mask.dim() <= 4:
        raise ValueError(
            f"mask must be a boolean tensor of 1-4 dims, got {mask.dtype} {mask.dim()}"
        )
    if mask.is_cuda:
        from .attention_masks import prepare_mask  # lazy: imports triton

        return prepare_mask(mask, tq, tk)
    return cpu.attention_mask_args(mask, tq, tk)


@invariant_attention_mask_args.register_fake
def _(mask, tq, tk):
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    rows = shape[0] * shape[1] * tq
    int32 = dict(dtype=torch.int32)
    words = mask.new_empty((rows, (tk + 31) // 32), **int32)
    return words, mask.new_empty((rows, 2), **int32), mask.new_empty((1,), **int32)
