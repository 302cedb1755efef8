"""Localize a learner/rollout gap: the first layer (and position) whose hidden states differ.

Two views of the same token sequences, each run batched (the sequences together) or alone:
- learner: ONE full forward over the right-padded sequences (`learner_hidden_states`);
- rollout: the engine's step, prefill of the prompts then teacher-forced decode of the rest
  (`rollout_hidden_states`), through a per-sequence static KV cache.
Hidden states are compared position by position, layer by layer (index 0 = embeddings, i =
after decoder layer i, then the logits). `localize_divergence` does this for a model and a
batch; the lower-level functions let a script compare any two views (batch vs alone, learner vs
rollout, Inductor vs the eager lowered graph).

Shape legend: B sequences, T_i length of sequence i, H hidden size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...recipe import NVFP4Recipe, as_recipe
from ...rollout.kv_cache import StaticKVCache
from ...rollout.logprobs import pad_right
from ...rollout.step import RolloutStep

States = list[list[torch.Tensor]]
"""states[i][layer] = [T_i, H] (or [T_i, V] for the logits) of sequence i."""


@dataclass
class LayerGap:
    name: str
    max_abs_diff: float
    num_differing: int
    num_elements: int
    first_position: int | None = None
    """First token position (over all sequences) whose values differ; None when identical."""


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
        lines = [f"{'where':<14} {'max |diff|':>12} {'differing':>18} {'first pos':>9}"]
        for g in self.layers:
            pos = "-" if g.first_position is None else str(g.first_position)
            lines.append(
                f"{g.name:<14} {g.max_abs_diff:12.3e} {g.num_differing:>9}/{g.num_elements:<8} {pos:>9}"
            )
        lines.append(f"first divergent: {self.first_divergent or 'none (bitwise identical)'}")
        return "\n".join(lines)


def _layer_names(num_states: int) -> list[str]:
    return ["embeddings"] + [f"layer {i}" for i in range(num_states - 2)] + ["logits"]


def _text_config(model):
    model = getattr(model, "_orig_mod", model)
    return getattr(model.config, "text_config", None) or model.config


@torch.no_grad()
def learner_hidden_states(learner, sequences: list[list[int]], *, device) -> States:
    """One forward of `learner` (a causal LM, compiled or not) over the right-padded batch."""
    ids, lengths = pad_right(sequences, device=device)
    out = learner(input_ids=ids, use_cache=False, output_hidden_states=True)
    states = [*out.hidden_states, out.logits]
    return [[s[i, :n] for s in states] for i, n in enumerate(lengths.tolist())]


@torch.no_grad()
def rollout_hidden_states(
    step,
    model,
    sequences: list[list[int]],
    prompt_lens: list[int],
    *,
    device,
    max_seq_len: int | None = None,
) -> States:
    """Prefill the prompts (right-padded, one step), then decode the rest of every sequence one
    token per step, teacher-forced. `step` is a `RolloutStep(model, return_hidden=True)`,
    compiled or not. All sequences must have the same number of tokens after their prompt.
    `max_seq_len` sizes the cache (default: the longest sequence), as the engine's does."""
    tails = {len(s) - p for s, p in zip(sequences, prompt_lens)}
    if len(tails) != 1:
        raise ValueError(f"sequences need equal generated lengths, got {sorted(tails)}")
    (num_new,) = tails
    cfg = _text_config(model)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    batch = len(sequences)
    cache = StaticKVCache(
        num_layers=cfg.num_hidden_layers,
        batch=batch,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        max_seq_len=max_seq_len or max(len(s) for s in sequences),
        dtype=next(getattr(model, "_orig_mod", model).parameters()).dtype,
        device=device,
    )
    tensors = [t for pair in zip(cache.keys, cache.values) for t in pair]
    prompts = [s[:p] for s, p in zip(sequences, prompt_lens)]
    ids, lengths = pad_right(prompts, device=device)
    width = ids.shape[1]
    positions = torch.arange(width, device=device).expand(batch, width).contiguous()
    first = step(ids, positions, lengths.to(device), *tensors)
    ordered = [*first[1:], first[0]]
    states: States = [[s[i, :n] for s in ordered] for i, n in enumerate(prompt_lens)]
    for t in range(num_new):
        tok = torch.tensor([[s[p + t]] for s, p in zip(sequences, prompt_lens)], device=device)
        pos = torch.tensor([[p + t] for p in prompt_lens], device=device)
        res = step(tok, pos, pos[:, 0] + 1, *tensors)
        ordered = [*res[1:], res[0]]
        for i in range(batch):
            states[i] = [torch.cat([a, b[i]]) for a, b in zip(states[i], ordered)]
    return states


def compare_states(a: States, b: States) -> Localization:
    """Per layer: how many values differ bitwise between two views of the same sequences, and
    the first position (counted over the concatenated sequences) where they do."""
    if len(a) != len(b):
        raise ValueError(f"views hold {len(a)} and {len(b)} sequences")
    gaps = []
    for layer, name in enumerate(_layer_names(len(a[0]))):
        x = torch.cat([s[layer] for s in a]).float()
        y = torch.cat([s[layer] for s in b]).float()
        if x.shape != y.shape:
            raise ValueError(f"{name}: shapes {tuple(x.shape)} and {tuple(y.shape)} differ")
        neq = x.view(torch.int32) != y.view(torch.int32)
        where = neq.any(dim=-1).nonzero()
        gaps.append(
            LayerGap(
                name,
                float((x - y).abs().max()) if x.numel() else 0.0,
                int(neq.sum()),
                x.numel(),
                int(where[0, 0]) if len(where) else None,
            )
        )
    return Localization(gaps)


def localize_divergence(
    model,
    sequences: list[list[int]] | list[int],
    prompt_lens: list[int] | int,
    *,
    recipe: NVFP4Recipe | dict | None = None,
    compile: bool = True,
) -> Localization:
    """Learner (one full forward) vs rollout (prefill + teacher-forced decode), both batched,
    through the minite lowering with the same recipe. A single sequence may be given as a flat
    token list with an int prompt length."""
    if sequences and isinstance(sequences[0], int):
        sequences, prompt_lens = [list(sequences)], [int(prompt_lens)]
    recipe = as_recipe(recipe)
    model = getattr(model, "_orig_mod", model).eval()
    device = next(model.parameters()).device
    learner = (
        torch.compile(model, backend="minite", options={"recipe": recipe}) if compile else model
    )
    step = RolloutStep(model, return_hidden=True)
    if compile:
        step = torch.compile(step, backend="minite", options={"recipe": recipe})
    ref = learner_hidden_states(learner, sequences, device=device)
    got = rollout_hidden_states(step, model, sequences, prompt_lens, device=device)
    return compare_states(ref, got)
