"""Pass, lower MoE routing: `topk(softmax(router_logits, dim=-1), k, dim=-1)` (transformers'
Qwen3-MoE router; the router's linear is already the invariant BF16 op via the bf16_modules
patterns) becomes the invariant routing op: softmax with a fixed reduction order and top-k with
deterministic tie-breaking (the lower expert index wins). Renormalization (norm_topk_prob) stays
as traced: a reduction over k <= 16 values."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, insert_call
from .patterns import is_softmax, is_topk, scalar_arg
from .report import LoweringReport
from .targets import emit_routing


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
        new = emit_routing(graph, topk, logits, k)
        # The model may renormalize the top-k values in place (Qwen3: `w /= w.sum()`); an op's
        # output must not be modified in place under autograd, so hand out a copy.
        values = insert_call(graph, operator.getitem, (new, 0), before=topk, like=topk)
        values = insert_call(graph, torch.ops.aten.clone.default, (values,), before=topk, like=topk)
        experts = insert_call(graph, operator.getitem, (new, 1), before=topk, like=topk)
        for user in list(topk.users):
            if (
                user.op == "call_function"
                and user.target is operator.getitem
                and user.args[1] in (0, 1)
            ):
                user.replace_all_uses_with(values if user.args[1] == 0 else experts)
                graph.erase_node(user)
        if topk.users:
            raise AssertionError(
                f"router top-k has users other than its two outputs: {list(topk.users)}"
            )
        graph.erase_node(topk)
        erase_dead(graph, [probs])
        report.count("routing_topk")
    gm.recompile()
