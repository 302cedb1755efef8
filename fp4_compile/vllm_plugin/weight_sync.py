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

from ..passes.targets import quantize_weight_bytes
from ..recipe import NVFP4Recipe
from ..rollout.weight_sync import full_tensor


@dataclass(frozen=True)
class LayerLayout:
    """A vLLM linear run by minite: the learner's module paths of its shards, in order."""

    learner_names: tuple[str, ...]
    precision: str  # "nvfp4" or "bf16"


@dataclass
class WeightPayload:
    nvfp4: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """vLLM module path -> (codes uint8 [N, K/2], scales uint8 [N, K/16], global decode FP32 [S])."""
    dense: dict[str, torch.Tensor] = field(default_factory=dict)
    """The learner's parameter name -> tensor, for vLLM's `load_weights`."""

    def num_bytes(self) -> dict[str, int]:
        nv = sum(t.numel() * t.element_size() for ts in self.nvfp4.values() for t in ts)
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
        if lay.precision != "nvfp4":
            continue
        codes, scales, gds = [], [], []
        for shard in lay.learner_names:
            key = f"{shard}.weight"
            if key not in params:
                raise ValueError(f"update_weights: the learner has no parameter {key!r}")
            c, s, gd = quantize_weight_bytes(full_tensor(params[key]), recipe, experts=False)
            codes.append(c)
            scales.append(s.view(torch.uint8))
            gds.append(gd.reshape(1))
            taken.add(key)
        out.nvfp4[vllm_name] = (torch.cat(codes), torch.cat(scales), torch.cat(gds))
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
    from .quantization import set_nvfp4_bytes

    modules = dict(vllm_model.named_modules())
    missing = sorted(set(payload.nvfp4) - set(modules))
    if missing:
        raise ValueError(f"update_weights: vLLM's model has no layers {missing[:4]}")
    for name, (codes, scales, gd) in payload.nvfp4.items():
        set_nvfp4_bytes(modules[name], codes, scales, gd)
    if payload.dense:
        vllm_model.load_weights(iter(payload.dense.items()))
    return len(payload.nvfp4)


@torch.no_grad()
def apply_bf16_refit(vllm_model: torch.nn.Module, payload: WeightPayload, recipe: NVFP4Recipe):
    """(worker) The baseline: load every weight, then re-quantize the NVFP4 layers in vLLM."""
    from .quantization import quantize_layer

    vllm_model.load_weights(iter(payload.dense.items()))
    for m in vllm_model.modules():
        if getattr(m, "minite_precision", None) == "nvfp4":
            quantize_layer(m, recipe)
