"""Learner weights into a running vLLM engine, in place, as NVFP4 bytes.

The learner quantizes each weight the recipe quantizes with its own quantizer (the bytes its
forward uses) and sends codes (4 bits per weight), E4M3 block scales (one byte per 16 weights)
and one FP32 global scale per shard: 4.5 bits per weight instead of BF16's 16. vLLM's layers
take them as they are (`set_nvfp4_bytes`), no re-quantization; everything the recipe keeps in
the master dtype (embeddings, norms, lm_head, BF16 linears) goes through vLLM's own
`model.load_weights`. `bf16_payload` / `apply_bf16_refit` are the baseline the benchmark
compares with: every weight as BF16, re-quantized inside vLLM.

`layer_layout` and the `apply_*` functions run on vLLM's worker (`LLM.apply_model`; in
multiprocess mode they travel pickled, with `functools.partial`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..recipe import NVFP4Recipe
from ..rollout.weight_sync import full_tensor
from .buffers import expert_buffers, linear_buffers, write_buffers


@dataclass(frozen=True)
class LayerLayout:
    """A vLLM linear run by minite: the learner's module paths of its shards, in order."""

    learner_names: tuple[str, ...]
    precision: str  # "nvfp4", "bf16", or "nvfp4_experts" (names: gate_up_proj, down_proj)


@dataclass
class WeightPayload:
    nvfp4: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    """vLLM module path -> its NVFP4 buffers: codes uint8 [.., N, K/2], scales uint8
    [.., N, K/16], global decode FP32 (one per shard or per expert)."""
    dense: dict[str, torch.Tensor] = field(default_factory=dict)
    """The learner's parameter name -> tensor, for vLLM's `load_weights`."""

    def num_bytes(self) -> dict[str, int]:
        nv = sum(t.numel() * t.element_size() for ts in self.nvfp4.values() for t in ts.values())
        dense = sum(t.numel() * t.element_size() for t in self.dense.values())
        return {"nvfp4_linears": nv, "dense": dense, "total": nv + dense}


def layer_layout(vllm_model: torch.nn.Module) -> dict[str, LayerLayout]:
    """(worker) Every minite linear of vLLM's model."""
    return {
        name: LayerLayout(tuple(m.minite_names), m.minite_precision)
        for name, m in vllm_model.named_modules()
        if hasattr(m, "minite_precision")
    }


@torch.no_grad()
def nvfp4_payload(
    learner: torch.nn.Module, layout: dict[str, LayerLayout], recipe: NVFP4Recipe
) -> WeightPayload:
    """(learner) The NVFP4 bytes of every NVFP4 layer of `layout`, the rest in the master dtype."""
    learner = getattr(learner, "_orig_mod", learner)
    params = dict(learner.named_parameters())
    out = WeightPayload()
    taken = set()
    for vllm_name, lay in layout.items():
        if lay.precision == "nvfp4_experts":
            missing = [n for n in lay.learner_names if n not in params]
            if missing:
                raise ValueError(f"update_weights: the learner has no parameters {missing}")
            w13, w2 = (full_tensor(params[n]) for n in lay.learner_names)
            out.nvfp4[vllm_name] = expert_buffers(w13, w2, recipe)
            taken.update(lay.learner_names)
            continue
        if lay.precision != "nvfp4":
            continue
        missing = [f"{n}.weight" for n in lay.learner_names if f"{n}.weight" not in params]
        if missing:
            raise ValueError(f"update_weights: the learner has no parameters {missing}")
        weights = [full_tensor(params[f"{n}.weight"]) for n in lay.learner_names]
        shards = tuple(int(w.shape[0]) for w in weights)
        out.nvfp4[vllm_name] = linear_buffers(torch.cat(weights), shards, recipe)
        taken.update(f"{n}.weight" for n in lay.learner_names)
    for name, p in params.items():
        if name not in taken:
            out.dense[name] = full_tensor(p.detach())
    return out


def bf16_payload(learner: torch.nn.Module) -> WeightPayload:
    """(learner) The baseline: every parameter as BF16."""
    learner = getattr(learner, "_orig_mod", learner)
    dense = {n: full_tensor(p.detach()).to(torch.bfloat16) for n, p in learner.named_parameters()}
    return WeightPayload(dense=dense)


@torch.no_grad()
def apply_payload(vllm_model: torch.nn.Module, payload: WeightPayload) -> int:
    """(worker) Write the payload in place; returns the number of NVFP4 layers written."""
    modules = dict(vllm_model.named_modules())
    missing = sorted(set(payload.nvfp4) - set(modules))
    if missing:
        raise ValueError(f"update_weights: vLLM's model has no layers {missing[:4]}")
    for name, tensors in payload.nvfp4.items():
        write_buffers(modules[name], tensors)
    if payload.dense:
        vllm_model.load_weights(iter(payload.dense.items()))
    return len(payload.nvfp4)


@torch.no_grad()
def apply_bf16_refit(vllm_model: torch.nn.Module, payload: WeightPayload, recipe: NVFP4Recipe):
    """(worker) The baseline: load every weight, then re-quantize the NVFP4 layers in vLLM."""
    vllm_model.load_weights(iter(payload.dense.items()))
    for m in vllm_model.modules():
        precision = getattr(m, "minite_precision", None)
        if precision == "nvfp4":
            write_buffers(m, linear_buffers(m.weight.data, m.minite_shards, recipe))
        elif precision == "nvfp4_experts":
            write_buffers(m, expert_buffers(m.w13_weight.data, m.w2_weight.data, recipe))
