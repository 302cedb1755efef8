"""Which tensors of a transformers model an NVFP4 checkpoint holds, and their bytes.

Shape legend: E experts, N out-features, K in-features, I expert intermediate, H hidden.

Every linear the recipe quantizes (the learner's own per-module decision, `gemm_precision`)
becomes one `QuantizedLinear` holding the learner's bytes (`quantize_weight_bytes`: 16x16 tiles,
the tile's scale repeated over its 16 rows, so the [N, K/16] block scales ARE the 1x16 layout
both formats store). Fused experts (transformers 5: `experts.gate_up_proj` [E, 2I, H],
`experts.down_proj` [E, H, I]) are quantized as the learner does (one global scale per expert
over gate and up together) and split into per-expert linears `experts.{e}.gate_proj` /
`up_proj` / `down_proj`, the names vLLM and the hub checkpoints use. With the recipe's
`shared_weight_scale`, q/k/v and gate/up are quantized as the learner does, under their group's
one global scale. Everything else stays in the master dtype.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..codegen.nvfp4.api import quantize_weight_bytes
from ..recipe import NVFP4Recipe
from ..weight_policy import FUSED_GROUPS, gemm_precision, shared_scale_groups

EXPERT_PARAMS = ("gate_up_proj", "down_proj")


@dataclass
class QuantizedLinear:
    """One NVFP4 linear, as minite's learner quantizes it."""

    name: str  # module path, e.g. "model.layers.0.self_attn.q_proj"
    codes: torch.Tensor  # uint8 [N, K/2], element 2i in the low nibble
    block_scales: torch.Tensor  # float8_e4m3fn [N, K/16]
    global_decode: torch.Tensor  # float32 [] (minite's per-tensor decode scale)


@dataclass
class ExportPlan:
    quantized: list[QuantizedLinear]
    dense: dict[str, torch.Tensor]  # state-dict name -> tensor, master dtype
    kept_bf16: list[str]  # module paths of linears that stay in the master dtype
    reasons: dict[str, str] = field(default_factory=dict)
    fused_mismatch: list[str] = field(default_factory=list)


def _layers(model) -> int:
    cfg = getattr(model.config, "text_config", None) or model.config
    return int(cfg.num_hidden_layers)


def _linear(
    name: str, weight: torch.Tensor, recipe: NVFP4Recipe, group: list[torch.Tensor]
) -> QuantizedLinear:

    codes, scales, gd = quantize_weight_bytes(weight, recipe, experts=False, group=group)
    return QuantizedLinear(
        name, codes.cpu(), scales.cpu().view(torch.float8_e4m3fn), gd.cpu().reshape(())
    )


def _experts(path: str, module, recipe: NVFP4Recipe, num_layers: int, plan: ExportPlan):
    """Split fused expert weights into per-expert linears (quantized or dense)."""

    extra = sorted(n for n, _ in module.named_parameters(recurse=False) if n not in EXPERT_PARAMS)
    if extra:
        raise ValueError(
            f"experts module {path!r} has parameters {extra} this export does not map "
            f"(supported: {list(EXPERT_PARAMS)})"
        )
    gate_up, down = module.gate_up_proj.detach(), module.down_proj.detach()
    num_experts, two_i, _ = gate_up.shape
    inter = two_i // 2
    for pname, w_ENK in (("gate_up_proj", gate_up), ("down_proj", down)):
        n, k = int(w_ENK.shape[1]), int(w_ENK.shape[2])
        precision, reason = gemm_precision(recipe, path, n=n, k=k, num_layers=num_layers)
        if precision == "nvfp4":
            codes, scales, gd = quantize_weight_bytes(w_ENK, recipe, experts=True)
            codes, scales = codes.cpu(), scales.cpu().view(torch.float8_e4m3fn)
            gd = gd.cpu().reshape(-1)
        for e in range(num_experts):
            rows = (
                {"gate_proj": slice(0, inter), "up_proj": slice(inter, two_i)}
                if pname == "gate_up_proj"
                else {"down_proj": slice(None)}
            )
            for proj, r in rows.items():
                name = f"{path}.{e}.{proj}"
                if precision == "nvfp4":
                    plan.quantized.append(
                        QuantizedLinear(
                            name, codes[e, r].contiguous(), scales[e, r].contiguous(), gd[e]
                        )
                    )
                else:
                    plan.dense[f"{name}.weight"] = w_ENK[e, r].cpu().contiguous().clone()
                    plan.kept_bf16.append(name)
                    plan.reasons[name] = reason


def plan_export(model, recipe: NVFP4Recipe) -> ExportPlan:
    """Quantize every linear the recipe quantizes, with the learner's quantizer (and its
    shared-scale groups: `weight_policy.shared_scale_groups`)."""

    model = getattr(model, "_orig_mod", model)
    num_layers = _layers(model)
    plan = ExportPlan(quantized=[], dense={}, kept_bf16=[])
    handled: set[str] = set()
    nvfp4 = {
        path: module.weight.detach()
        for path, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and gemm_precision(
            recipe, path, n=module.weight.shape[0], k=module.weight.shape[1], num_layers=num_layers
        )[0]
        == "nvfp4"
    }
    group_of = {
        path: [nvfp4[p] for p in paths]
        for paths in shared_scale_groups(nvfp4, recipe).values()
        for path in paths
    }
    for path, module in model.named_modules():
        if all(isinstance(getattr(module, p, None), torch.nn.Parameter) for p in EXPERT_PARAMS):
            if module.gate_up_proj.dim() == 3:
                _experts(path, module, recipe, num_layers, plan)
                handled |= {f"{path}.{n}" for n, _ in module.named_parameters(recurse=False)}
            continue
        if isinstance(module, torch.nn.Linear):
            if module.bias is not None:
                raise ValueError(f"linear {path!r} has a bias; this export writes none")
            n, k = module.weight.shape
            precision, reason = gemm_precision(recipe, path, n=n, k=k, num_layers=num_layers)
            if precision == "nvfp4":
                weight = module.weight.detach()
                plan.quantized.append(_linear(path, weight, recipe, group_of.get(path, [])))
                handled.add(f"{path}.weight")
            else:
                plan.kept_bf16.append(path)
                plan.reasons[path] = reason
        elif not isinstance(module, torch.nn.Embedding):
            w = getattr(module, "weight", None)
            if isinstance(w, torch.nn.Parameter) and w.dim() == 2:  # e.g. a MoE router
                plan.kept_bf16.append(path)
                plan.reasons[path] = "not an nn.Linear (router or custom projection)"
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for name, tensor in model.state_dict().items():
        if name in handled or (tied and name == "lm_head.weight"):
            continue
        plan.dense[name] = tensor.detach().cpu().contiguous().clone()
    plan.fused_mismatch = fused_mismatches(plan.quantized, plan.kept_bf16)
    return plan


def fused_mismatches(quantized: list[QuantizedLinear], kept: list[str]) -> list[str]:
    """Fused groups (q/k/v, gate/up) whose shards an engine cannot load as one NVFP4 layer
    exactly: different global scales (vLLM keeps the max of the shards'), or shards in
    different precisions."""

    by_name = {q.name: q for q in quantized}
    kept_set = set(kept)
    out = []
    for name in sorted(by_name.keys() | kept_set):
        parent, _, leaf = name.rpartition(".")
        for group in FUSED_GROUPS:
            if leaf != group[0]:
                continue
            names = [f"{parent}.{g}" for g in group]
            if not all(n in by_name or n in kept_set for n in names):
                continue
            if any(n in kept_set for n in names) and any(n in by_name for n in names):
                out.append(f"{parent}.{{{','.join(group)}}} (mixed NVFP4/BF16)")
                continue
            if all(n in by_name for n in names):
                bits = {by_name[n].global_decode.view(torch.int32).item() for n in names}
                if len(bits) > 1:
                    out.append(f"{parent}.{{{','.join(group)}}}")
    return out


_EXPERT_NAME = re.compile(r"^(?P<path>.+)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)$")


def split_expert_name(name: str) -> tuple[str, int, str] | None:
    """Split an expert linear name: `model.layers.0.mlp.experts.3.up_proj` -> (path, 3, proj)."""
    m = _EXPERT_NAME.match(name)
    return (m["path"], int(m["e"]), m["proj"]) if m else None
