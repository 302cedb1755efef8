"""The rollout step as a module: one forward of the causal LM over Tq new tokens per sequence,
writing its keys/values into a per-sequence static cache. Prefill (Tq = prompt length) and
decode (Tq = 1) are the same step; `torch.export` captures it with dynamic B and Tq."""

from __future__ import annotations

import inspect

import torch

from .kv_cache import StaticKVCache, attention_mask_4d


class RolloutStep(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, *, return_hidden: bool = False):
        super().__init__()
        self.model = model
        self.return_hidden = return_hidden
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def forward(self, input_ids_BT, positions_BT, kv_len_B, *caches):
        """caches: k_0, v_0, k_1, v_1, ... each [B, H_kv, S_max, D], updated in place."""
        num_layers = len(caches) // 2
        cache = StaticKVCache.from_tensors(list(caches[0::2]), list(caches[1::2]))
        cache.write_positions = positions_BT
        mask = attention_mask_4d(positions_BT, kv_len_B, caches[0].shape[2])
        out = self.model(
            input_ids=input_ids_BT,
            attention_mask=mask,
            position_ids=positions_BT,
            use_cache=True,
            output_hidden_states=self.return_hidden,
            **{self.cache_kwarg: cache},
        )
        assert len(cache.keys) == num_layers
        if self.return_hidden:
            return (out.logits, *out.hidden_states)
        return out.logits
