"""Pass, lower MoE routing: `topk(softmax(router_logits, dim=-1), k, dim=-1)` (transformers'
Qwen3-MoE router; the router's linear is already the invariant BF16 op via the bf16_modules
patterns) becomes the invariant routing op: softmax with a fixed reduction order and top-k with
deterministic tie-breaking (the lower expert index wins). Renormalization (norm_topk_prob) stays
as traced: a reduction over k <= 16 values."""

from __future__ import annotations

import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, insert_call
from .patterns import is_softmax, is_topk, scalar_arg
from .report import LoweringReport
from .targets import routing_target


def _last_dim(node: fx.Node, index: int) -> bool:
    return scalar_arg(node, index, "dim", -1) in (-1,)


def lower_routing(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for topk in list(graph.nodes):
        if not is_topk(topk):
            continue
        probs = topk.args[0]
        if not is_softmax(probs) or not _last_dim(probs, 1) or not _last_dim(topk, 2):
            continue
        k = scalar_arg(topk, 1, "k")
        if scalar_arg(topk, 3, "largest", True) is not True or not isinstance(k, int):
            continue
        logits = probs.args[0]
        new = insert_call(graph, routing_target(), (logits, k), before=topk, like=topk)
        topk.replace_all_uses_with(new)
        graph.erase_node(topk)
        erase_dead(graph, [probs])
        report.count("routing_topk")
    gm.recompile()
