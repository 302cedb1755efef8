"""Pass 1, select: decide per GEMM site whether it runs in NVFP4 or stays BF16.

The decision is the recipe's weight policy (`fp4_compile/weight_policy.py`: the recipe
(quantize=False), a `bf16_modules` name pattern (embeddings, lm_head, MoE router), the
first/last N decoder layers, or a shape that cannot be quantized), made here for each traced
site, with the reason. Decisions are stored in node.meta["minite_gemm"] for the lowering passes.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from ..weight_policy import decide, layer_index
from .graph_utils import fake, is_call, module_path
from .patterns import is_linear
from .report import GemmDecision, LoweringReport


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
        precision, reason = decide(recipe, path, n, k, layer, num_layers)
        decision = GemmDecision(
            module=path, kind=kind, shape=str(list(shape)), precision=precision, reason=reason
        )
        node.meta["minite_gemm"] = decision
        report.gemms.append(decision)
