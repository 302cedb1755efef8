"""The weight policy of a recipe: which GEMM weights are NVFP4, how they group under one global
scale, and how they are quantized (the exact bytes: `codegen.nvfp4.api.quantize_weight_bytes`,
which runs the quantize op the graph runs). Part of the numerics contract beside the
recipe: the lowering (passes/), the rollout export, the checkpoint export and the vLLM plugin all
ask this module, so a weight is quantized the same way wherever it is read.

Shape legend: N out-features, K in-features, E experts.

- `gemm_precision` / `decide`: "nvfp4" or "bf16" (with the reason) for a GEMM of module path
  `path` and weight [N, K]: the recipe (quantize=False), a `bf16_modules` name pattern, the
  first/last N decoder layers, or a shape that cannot be quantized (K or N not a multiple of 16:
  reported, never padded).
- `shared_scale_groups`: the linears an inference engine fuses into one layer and gives ONE
  weight global scale (vLLM's QKVParallelLinear and MergedColumnParallelLinear: q/k/v of one
  attention, gate/up of one MLP) when `recipe.shared_weight_scale`; only members the recipe
  quantizes count, a group needs at least two.
- `weight_quantize_mode`: a weight's global-scale mode (per tensor, per expert), which the
  lowering's weight-quantize nodes and `quantize_weight_bytes` both take from here.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

import torch

from .recipe import NVFP4Recipe

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_LAYER_INDEX = re.compile(r"(^|\.)layers\.\d+(\.|$)")

# the reason recorded for a GEMM that stays BF16 because of its shape; `verify` refuses it in a
# batch-invariant NVFP4 recipe unless `bf16_modules` names the module
SHAPE_REASON = "shape: K or N not a multiple of 16, cannot be NVFP4 (not padded)"

FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def layer_index(path: str) -> int | None:
    """The decoder layer index of a module path ("model.layers.3.mlp" -> 3), or None."""
    m = _LAYER.search(path)
    return int(m.group(1)) if m else None


def names_module(path: str, pattern: str) -> bool:
    """Does the `bf16_modules` fnmatch `pattern` name the module at `path`? A pattern "*.x" also
    names "x" at the root of the traced graph: FSDP2 compiles each decoder layer as a graph of
    its own, where the MoE router is "mlp.gate", not "model.layers.3.mlp.gate"."""
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase("." + path, pattern)


def decide(
    recipe: NVFP4Recipe, path: str, n: int, k: int, layer: int | None, num_layers: int
) -> tuple[str, str]:
    """("nvfp4" | "bf16", reason) of a GEMM of module `path` (decoder layer `layer` of
    `num_layers`) with weight [N, K]."""
    if not recipe.quantize:
        return "bf16", "recipe: quantize=False"
    for pattern in recipe.bf16_modules:
        if names_module(path, pattern):
            return "bf16", f"bf16_modules pattern {pattern!r}"
    if layer is not None and layer < recipe.bf16_first_layers:
        return "bf16", f"layer {layer} < bf16_first_layers={recipe.bf16_first_layers}"
    if layer is not None and layer >= num_layers - recipe.bf16_last_layers:
        return "bf16", f"layer {layer} in bf16_last_layers={recipe.bf16_last_layers}"
    if k % 16 or n % 16:
        return "bf16", f"{SHAPE_REASON} (N={n}, K={k})"
    return "nvfp4", ""


def gemm_precision(
    recipe: NVFP4Recipe, path: str, *, n: int, k: int, num_layers: int
) -> tuple[str, str]:
    """("nvfp4" | "bf16", reason) of a GEMM of module `path` with weight [N, K]: the decision the
    lowering makes for a traced site (`passes/select_gemms.py`), for code that walks modules
    instead of a graph (the checkpoint export, the vLLM plugin)."""
    return decide(recipe, path, n, k, layer_index(path), num_layers)


def module_gemms(model: torch.nn.Module) -> list[tuple[str, int, int]]:
    """(module path, N, K) of every GEMM weight of a transformers causal LM, from the modules
    alone (shapes only: a model on the meta device will do): each 2-D `nn.Linear`, and fused
    experts (transformers 5: `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I], one site each
    under the experts module's path, as the lowering names its grouped GEMMs)."""
    model = getattr(model, "_orig_mod", model)
    sites = []
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            n, k = module.weight.shape
            sites.append((path, int(n), int(k)))
            continue
        for name in ("gate_up_proj", "down_proj"):
            w = getattr(module, name, None)
            if isinstance(w, torch.nn.Parameter) and w.dim() == 3:
                sites.append((path, int(w.shape[1]), int(w.shape[2])))
    return sites


def shape_fallbacks(model: torch.nn.Module, recipe: NVFP4Recipe) -> list[tuple[str, int, int]]:
    """(module path, N, K) of the GEMMs of `model` the recipe would quantize but cannot, because
    K or N is not a multiple of 16 (the ones `passes/verify.py` refuses in a batch-invariant
    recipe unless `bf16_modules` names them). Read from the modules, before any compile."""
    sites = module_gemms(model)
    layers = [layer_index(path) for path, _, _ in sites]
    num_layers = 1 + max((i for i in layers if i is not None), default=-1)
    return [
        (path, n, k)
        for (path, n, k), layer in zip(sites, layers)
        if decide(recipe, path, n, k, layer, num_layers)[1].startswith(SHAPE_REASON)
    ]


def layer_patterns(paths: list[str]) -> list[str]:
    """fnmatch patterns naming `paths` in every decoder layer, under any prefix the module is
    traced with (the rollout engine traces the model one level down: `model.model.layers.3...`):
    `model.layers.3.mlp.up_proj` -> `*model.layers.*.mlp.up_proj`, in first-seen order (the
    `bf16_modules` that keep `shape_fallbacks`' modules BF16)."""
    patterns: dict[str, None] = {}
    for path in paths:
        patterns["*" + _LAYER_INDEX.sub(r"\1layers.*\2", path)] = None
    return list(patterns)


def fused_group(path: str) -> str | None:
    """The fused group a module path belongs to, named by its parent and the group's leaves
    ("model.layers.0.self_attn.{q_proj,k_proj,v_proj}"), or None."""
    parent, _, leaf = path.rpartition(".")
    for group in FUSED_GROUPS:
        if leaf in group:
            return f"{parent}.{{{','.join(group)}}}" if parent else f"{{{','.join(group)}}}"
    return None


def _leaf_rank(path: str) -> int:
    leaf = path.rpartition(".")[2]
    return next(g.index(leaf) for g in FUSED_GROUPS if leaf in g)


def shared_scale_groups(nvfp4_paths: Iterable[str], recipe: NVFP4Recipe) -> dict[str, list[str]]:
    """{group name: its member paths in group order (q, k, v / gate, up)} over the module paths
    the recipe quantizes to NVFP4, for every group with at least two of them; {} when the
    recipe's `shared_weight_scale` is off."""
    if not recipe.shared_weight_scale:
        return {}
    groups: dict[str, set[str]] = {}
    for path in nvfp4_paths:
        name = fused_group(path)
        if name is not None:
            groups.setdefault(name, set()).add(path)
    return {
        name: sorted(members, key=_leaf_rank)
        for name, members in sorted(groups.items())
        if len(members) > 1
    }


def weight_quantize_mode(recipe: NVFP4Recipe, weight_dim: int) -> str:
    """The global-scale mode of a weight's quantize: per expert for [E, N, K], else per tensor."""
    if recipe.weight.global_scale == "static":
        raise NotImplementedError("static weight scales are not lowered by the pass pipeline yet")
    return "per_expert" if weight_dim == 3 else "per_tensor"
