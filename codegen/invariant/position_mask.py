"""`fp4_compile::invariant_position_mask`: the rollout step's attention mask, made from the
positions and lengths, with everything the step's attentions read of it, in one launch.

Shape legend: B sequences, Tq new tokens per sequence, S key slots (the cache's max_seq_len), a
mask row per (sequence, query): rows = B * Tq, W = ceil(S / 32).

- invariant_position_mask(positions [B, Tq] int64, kv_len [B] int64, max_seq_len S)
    -> (mask [B, 1, Tq, S] bool, words [rows, W] int32, intervals [rows, 2] int32, flag [1]
    int32, q_start [B] int64, kv_keys [B] int64)
  mask: key j is visible to the query at position p iff j <= p and j < kv_len, and every row
  sees key 0 (rows past a sequence's end stay finite); words, intervals, flag: what
  `fp4_compile::invariant_attention_mask_args(mask, Tq, S)` makes of it; q_start, kv_keys: the
  lengths an attention over the mask takes (zeros and S: the mask decides what is seen).
`passes/targets.py`'s `emit_attention` hands the last five to every attention whose mask is
this op's (instead of an `invariant_attention_mask_args` op and two `full`s): 5 launches of the
step become 1. Integers and booleans only: no numerics of its own.
CPU: `decode_reference.position_mask_args` (the torch ops the step ran, then the mask-args
reference). CUDA: `position_mask_kernel` (one launch, one program per row, imported lazily).
"""

from __future__ import annotations

import torch

from . import decode_reference


def _check(positions: torch.Tensor, kv_len: torch.Tensor, max_seq_len: int) -> None:
    if positions.dtype != torch.int64 or kv_len.dtype != torch.int64:
        raise TypeError(
            f"positions and kv_len must be int64, got {positions.dtype}, {kv_len.dtype}"
        )
    if positions.dim() != 2 or tuple(kv_len.shape) != (positions.shape[0],):
        raise ValueError(
            f"positions must be [B, Tq] and kv_len [B], got {list(positions.shape)}, "
            f"{list(kv_len.shape)}"
        )
    if isinstance(max_seq_len, int) and max_seq_len < 1:  # a traced size: checked where made
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")


@torch.library.custom_op("fp4_compile::invariant_position_mask", mutates_args=())
def invariant_position_mask(
    positions: torch.Tensor, kv_len: torch.Tensor, max_seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(positions, kv_len, max_seq_len)
    if positions.is_cuda:
        from .position_mask_kernel import position_mask  # lazy: imports triton

        return position_mask(positions, kv_len, max_seq_len)
    return decode_reference.position_mask_args(positions, kv_len, max_seq_len)


@invariant_position_mask.register_fake
def _(positions, kv_len, max_seq_len):
    _check(positions, kv_len, max_seq_len)
    b, tq = positions.shape
    rows, int32 = b * tq, dict(dtype=torch.int32)
    return (
        positions.new_empty((b, 1, tq, max_seq_len), dtype=torch.bool),
        positions.new_empty((rows, (max_seq_len + 31) // 32), **int32),
        positions.new_empty((rows, 2), **int32),
        positions.new_empty((1,), **int32),
        positions.new_empty((b,)),
        positions.new_empty((b,)),
    )
