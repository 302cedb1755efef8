"""The rollout step as a module: one forward of the causal LM over Tq new tokens per sequence,
writing its keys/values into a per-sequence static cache. Prefill (Tq = prompt length) and
decode (Tq = 1) are the same step; `torch.export` captures it with dynamic B and Tq.

The head runs only where it is read: sampling needs the logits of each sequence's LAST new
position, so the step runs the decoder, takes that one hidden row per sequence and applies the
output embedding (and the model's final logit soft-capping, where its config has one) to it:
[B, 1, V] logits, never [B, Tq, V]. The row is `kv_len - 1 - positions[:, 0]` (the prompt's last
token in a prefill, 0 in a decode: at Tq = 1 the hidden rows are read as they are, with no
gather, wherever Tq is a static 1 (torch.compile specializes a size of 1; an export keeps Tq
symbolic and the gather). A row of the head is the same op on the same hidden row as in the
learner's full forward (rows never interact), so its bits are the learner's.
`return_hidden=True` (diagnostics) keeps the model's own forward: logits at every position and the
hidden states.
"""

from __future__ import annotations

import inspect

import torch

from .kv_cache import StaticKVCache, attention_mask_4d
from .paged_kv_cache import PagedKVCache


def _cache_kwarg(module: torch.nn.Module) -> str:
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class RolloutStep(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, *, return_hidden: bool = False):
        super().__init__()
        self.model = model
        self.return_hidden = return_hidden
        self.cache_kwarg = _cache_kwarg(model)
        if not return_hidden:
            decoder, head = model.get_decoder(), model.get_output_embeddings()
            if decoder is None or head is None:
                raise TypeError(
                    f"{type(model).__name__} has no get_decoder() / get_output_embeddings(): the "
                    "rollout step needs a transformers causal LM"
                )
            self.decoder_cache_kwarg = _cache_kwarg(decoder)
        cfg = getattr(model.config, "text_config", None) or model.config
        self.softcap = getattr(cfg, "final_logit_softcapping", None)

    def forward(self, input_ids_BT, positions_BT, kv_len_B, *caches, block_table=None):
        """caches: k_0, v_0, k_1, v_1, ... each [B, H_kv, S_max, D], updated in place; or, with
        block_table [B, P] (a paged cache, `paged_kv_cache.py`), page pools [N, H_kv, PAGE, D].
        Returns the logits [B, 1, V] of each sequence's last new position (see the module doc)."""
        num_layers = len(caches) // 2
        keys, values = list(caches[0::2]), list(caches[1::2])
        if block_table is None:
            cache = StaticKVCache.from_tensors(keys, values)
        else:
            cache = PagedKVCache.from_tensors(keys, values, block_table)
        cache.write_positions = positions_BT
        mask = attention_mask_4d(positions_BT, kv_len_B, cache.max_seq_len)
        common = dict(attention_mask=mask, position_ids=positions_BT, use_cache=True)
        if self.return_hidden:
            out = self.model(
                input_ids=input_ids_BT,
                output_hidden_states=True,
                **common,
                **{self.cache_kwarg: cache},
            )
            assert len(cache.keys) == num_layers
            return (out.logits, *out.hidden_states)
        out = self.model.get_decoder()(
            input_ids=input_ids_BT, **common, **{self.decoder_cache_kwarg: cache}
        )
        assert len(cache.keys) == num_layers
        hidden_BTH = out.last_hidden_state
        if not torch.compiler.is_exporting() and input_ids_BT.shape[1] == 1:
            last_B1H = hidden_BTH  # a decode: its one position is the last (no gather kernel)
        else:
            last_B = kv_len_B - 1 - positions_BT[:, 0]
            index = last_B[:, None, None].expand(-1, 1, hidden_BTH.shape[-1])
            last_B1H = torch.gather(hidden_BTH, 1, index)
        logits = self.model.get_output_embeddings()(last_B1H)
        if self.softcap is not None:  # as transformers' Gemma heads: tanh(logits / cap) * cap
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
