"""Localize a learner/rollout gap: the first layer whose hidden states differ.

The learner runs one full forward over the sequence; the rollout prefills the prompt and then
decodes the rest token by token (teacher-forced with the sequence's own tokens), both through
the minite lowering with the same recipe. Hidden states are compared position by position, layer
by layer (index 0 = embeddings, i = after decoder layer i, then the logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..recipe import NVFP4Recipe, as_recipe
from .kv_cache import StaticKVCache
from .rollout_step import RolloutStep


@dataclass
class LayerGap:
    name: str
    max_abs_diff: float
    num_differing: int
    num_elements: int


@dataclass
class Localization:
    layers: list[LayerGap]

    @property
    def first_divergent(self) -> str | None:
        for layer in self.layers:
            if layer.num_differing:
                return layer.name
        return None

    def table(self) -> str:
        lines = [f"{'where':<14} {'max |diff|':>12} {'differing':>14}"]
        for g in self.layers:
            lines.append(
                f"{g.name:<14} {g.max_abs_diff:12.3e} {g.num_differing:>7}/{g.num_elements:<7}"
            )
        lines.append(f"first divergent: {self.first_divergent or 'none (bitwise identical)'}")
        return "\n".join(lines)


@torch.no_grad()
def localize_divergence(
    model,
    sequence: list[int],
    prompt_len: int,
    *,
    recipe: NVFP4Recipe | dict | None = None,
    compile: bool = True,
) -> Localization:
    recipe = as_recipe(recipe)
    model = getattr(model, "_orig_mod", model).eval()
    device = next(model.parameters()).device
    ids = torch.tensor([sequence], device=device)
    learner = (
        torch.compile(model, backend="minite", options={"recipe": recipe}) if compile else model
    )
    out = learner(input_ids=ids, use_cache=False, output_hidden_states=True)
    learner_states = [*out.hidden_states, out.logits]

    cfg = getattr(model.config, "text_config", None) or model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = StaticKVCache(
        num_layers=cfg.num_hidden_layers,
        batch=1,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        max_seq_len=len(sequence),
        dtype=next(model.parameters()).dtype,
        device=device,
    )
    step = RolloutStep(model, return_hidden=True)
    if compile:
        step = torch.compile(step, backend="minite", options={"recipe": recipe})
    tensors = [t for pair in zip(cache.keys, cache.values) for t in pair]
    pos = torch.arange(prompt_len, device=device)[None]
    first = step(ids[:, :prompt_len], pos, torch.tensor([prompt_len], device=device), *tensors)
    pieces = [list(first[1:]) + [first[0]]]
    for t in range(prompt_len, len(sequence)):
        res = step(
            ids[:, t : t + 1],
            torch.tensor([[t]], device=device),
            torch.tensor([t + 1], device=device),
            *tensors,
        )
        pieces.append(list(res[1:]) + [res[0]])
    rollout_states = [torch.cat([p[i] for p in pieces], dim=1) for i in range(len(learner_states))]
    names = ["embeddings"] + [f"layer {i}" for i in range(len(learner_states) - 2)] + ["logits"]
    gaps = []
    for name, a, b in zip(names, learner_states, rollout_states):
        a, b = a.float(), b.float()
        differing = (a.view(torch.int32) != b.view(torch.int32)).sum()
        gaps.append(LayerGap(name, float((a - b).abs().max()), int(differing), a.numel()))
    return Localization(gaps)
