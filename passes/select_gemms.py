"""Pass 1, select: decide per GEMM site whether it runs in NVFP4 or stays BF16.

Sources of a BF16 decision, each recorded as the reason: the recipe (quantize=False), a
`bf16_modules` name pattern (embeddings, lm_head, MoE router), the first/last N decoder layers,
or a shape that cannot be quantized (K or N not a multiple of 16: reported, never padded).
Decisions are stored in node.meta["minite_gemm"] for the lowering passes.
"""

from __future__ import annotations

import fnmatch

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, is_call, layer_index, module_path
from .patterns import is_linear
from .report import GemmDecision, LoweringReport

# the reason recorded for a GEMM that stays BF16 because of its shape; `verify` refuses it in a
# batch-invariant NVFP4 recipe unless `bf16_modules` names the module
SHAPE_REASON = "shape: K or N not a multiple of 16, cannot be NVFP4 (not padded)"


def grouped_mm_targets() -> tuple:
    targets = []
    if hasattr(torch, "_grouped_mm"):
        targets.append(torch._grouped_mm)
        targets.append(torch.ops.aten._grouped_mm.default)
    try:
        targets.append(torch.ops.transformers.grouped_mm_fallback.default)
        targets.append(torch.ops.transformers.grouped_mm_fallback)
    except (AttributeError, RuntimeError):
        pass
    return tuple(targets)


def _grouped_weight_shape(node: fx.Node) -> tuple[int, ...] | None:
    w = fake(node.args[1]) if len(node.args) > 1 else None
    if w is None:
        return None
    e, k, n = w.shape  # grouped_mm takes weights as [E, K, N]
    return (int(e), int(n), int(k))


def _decide(
    recipe: NVFP4Recipe, path: str, n: int, k: int, layer: int | None, num_layers: int
) -> tuple[str, str]:
    if not recipe.quantize:
        return "bf16", "recipe: quantize=False"
    for pattern in recipe.bf16_modules:
        if fnmatch.fnmatchcase(path, pattern):
            return "bf16", f"bf16_modules pattern {pattern!r}"
    if layer is not None and layer < recipe.bf16_first_layers:
        return "bf16", f"layer {layer} < bf16_first_layers={recipe.bf16_first_layers}"
    if layer is not None and layer >= num_layers - recipe.bf16_last_layers:
        return "bf16", f"layer {layer} in bf16_last_layers={recipe.bf16_last_layers}"
    if k % 16 or n % 16:
        return "bf16", f"{SHAPE_REASON} (N={n}, K={k})"
    return "nvfp4", ""


def select_gemms(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    grouped = grouped_mm_targets()
    sites = []
    for node in gm.graph.nodes:
        if is_linear(node):
            w = fake(node.args[1])
            if w is None or w.dim() != 2:
                continue
            sites.append((node, "linear", (int(w.shape[0]), int(w.shape[1]))))
        elif grouped and is_call(node, *grouped):
            shape = _grouped_weight_shape(node)
            if shape is not None:
                sites.append((node, "grouped_mm", shape))
    layers = [layer_index(module_path(n)) for n, _, _ in sites]
    num_layers = 1 + max((i for i in layers if i is not None), default=-1)
    for (node, kind, shape), layer in zip(sites, layers):
        path = module_path(node)
        n, k = shape[-2], shape[-1]
        precision, reason = _decide(recipe, path, n, k, layer, num_layers)
        decision = GemmDecision(
            module=path, kind=kind, shape=str(list(shape)), precision=precision, reason=reason
        )
        node.meta["minite_gemm"] = decision
        report.gemms.append(decision)


def gemm_precision(
    recipe: NVFP4Recipe, path: str, *, n: int, k: int, num_layers: int
) -> tuple[str, str]:
    """("nvfp4" | "bf16", reason) of a GEMM of module `path` with weight [N, K]: the decision
    this pass makes for a traced site, for code that walks modules instead of a graph (the
    checkpoint export)."""
    return _decide(recipe, path, n, k, layer_index(path), num_layers)
