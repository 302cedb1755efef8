"""A static, per-sequence KV cache for the rollout engine (duck-types transformers' Cache).

Shape legend: B sequences, H_kv key/value heads, S_max cache slots, D head dim, Tq new tokens.

Every sequence stores its keys from slot 0 (never left-padded), so a query at position t sees
its keys at the same absolute positions, in the same fixed-size blocks from position 0, as the
learner's full-sequence forward: the alignment contract of the attention op. Slots beyond a
sequence's length hold stale values and are masked (masked keys are exact no-ops).
"""

from __future__ import annotations

import torch

from .. import codegen  # noqa: F401  (registers fp4_compile::kv_cache_write)


class TransformersCacheQueries:
    """What transformers asks of a cache besides `update`, for the rollout's caches (static and
    paged): `keys` per layer and `max_seq_len` slots; no sliding layers, and the step passes
    the mask and positions itself (so the "seen" length is 0)."""

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self.keys)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.max_seq_len

    def get_mask_sizes(self, *args, **kwargs):
        return self.max_seq_len, 0

    def __len__(self) -> int:
        return len(self.keys)


class StaticKVCache(TransformersCacheQueries):
    """k/v tensors [B, H_kv, S_max, D] per layer, written at explicit per-sequence positions."""

    is_compileable = True

    def __init__(
        self,
        *,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (batch, num_kv_heads, max_seq_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_seq_len = max_seq_len
        self.write_positions = None  # [B, Tq] int64, set before each forward

    @classmethod
    def from_tensors(cls, keys: list[torch.Tensor], values: list[torch.Tensor]) -> StaticKVCache:
        """Wrap existing cache tensors (the exported step receives them as inputs)."""
        cache = cls.__new__(cls)
        cache.keys, cache.values = keys, values
        cache.max_seq_len = keys[0].shape[2]
        cache.write_positions = None
        return cache

    def set_write_positions(self, positions_BT: torch.Tensor) -> None:
        if positions_BT.dim() != 2 or int(positions_BT.max()) >= self.max_seq_len:
            raise ValueError(
                f"write positions must be [B, Tq] below max_seq_len={self.max_seq_len}, "
                f"got shape {tuple(positions_BT.shape)} max {int(positions_BT.max())}"
            )
        self.write_positions = positions_BT

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ):
        """Write [B, H_kv, Tq, D] at the sequences' positions; return the whole cache layer.

        One op writes both, `fp4_compile::kv_cache_write` (one launch on CUDA), in place: on a
        graph input Inductor calls it on the cache itself (no clone of the layer cache, no copy
        back: tests/rollout/test_kv_cache_write.py reads it from the generated code)."""
        positions = self.write_positions
        assert positions is not None, "set_write_positions() before the forward"
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        torch.ops.fp4_compile.kv_cache_write(keys, values, positions, key_states, value_states)
        return keys, values


def attention_mask_4d(
    query_positions_BT: torch.Tensor, kv_len_B: torch.Tensor, max_seq_len: int
) -> torch.Tensor:
    """Boolean [B, 1, Tq, S_max]: key j is visible to the query at position p iff j <= p and
    j < kv_len (its sequence's length after this step). Query rows past a sequence's end (padding)
    see key 0 only, so they stay finite and never touch real rows. Made by
    `fp4_compile::invariant_position_mask` (the same torch ops on CPU), whose other outputs, what
    the attentions read of the mask, the lowering hands to every attention over it (one launch
    for the mask, its kernel arguments and the attentions' lengths)."""
    return torch.ops.fp4_compile.invariant_position_mask(query_positions_BT, kv_len_B, max_seq_len)[
        0
    ]
