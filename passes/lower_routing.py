"""Pass, lower MoE routing: `topk(softmax(router_logits, dim=-1), k, dim=-1)` (transformers'
Qwen3-MoE router; the router's linear is already the invariant BF16 op via the bf16_modules
patterns) becomes the invariant routing op: softmax with a fixed reduction order and top-k with
deterministic tie-breaking (the lower expert index wins). The renormalization of the selected
values (norm_topk_prob: `w /= w.sum(-1, keepdim=True)`) is absorbed into the op: left traced, its
BACKWARD holds a stock sum over the k values (the denominator's gradient), which Inductor and
eager reduce in different orders (on the H200 the Qwen3-30B-A3B-shaped router gradients differed
from the eager lowered graph in 18-86k of 262k elements,
2026-12-03_grad_localize_gpu_30b4k_bf16.md, the e711fd9 run). The op renormalizes with the same
sequential sum and IEEE division, so the forward bits are those of the traced form."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, insert_call
from .patterns import is_div, is_softmax, is_sum, is_topk, scalar_arg
from .report import LoweringReport
from .targets import emit_routing


def _last_dim(node: fx.Node, index: int) -> bool:
    return scalar_arg(node, index, "dim", -1) in (-1,)


def _is_sum_last_keepdim(node, src) -> bool:
    if not isinstance(node, fx.Node) or not node.args or node.args[0] is not src:
        return False
    dim = scalar_arg(node, 1, "dim", None)
    keep = scalar_arg(node, 2, "keepdim", False)
    return is_sum(node) and dim in (-1, [-1], (-1,)) and keep is True and len(node.users) == 1


def _renormalization(topk: fx.Node):
    """(sum node, division node) of `values / values.sum(-1, keepdim=True)` on the top-k values
    (in place or not, Dynamo or ATen spelling), the values used by nothing else; else None."""
    values = [
        u
        for u in topk.users
        if u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0
    ]
    if len(values) != 1 or len(values[0].users) != 2:
        return None
    v = values[0]
    total = next((u for u in v.users if _is_sum_last_keepdim(u, v)), None)
    if total is None:
        return None
    (div,) = [u for u in v.users if u is not total]
    if not (is_div(div) and len(div.args) == 2 and div.args[0] is v and div.args[1] is total):
        return None
    return total, div


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
        renorm = _renormalization(topk)
        new = emit_routing(graph, topk, logits, k, norm_topk_prob=renorm is not None)
        # The model may renormalize the top-k values in place (Qwen3: `w /= w.sum()`); an op's
        # output must not be modified in place under autograd, so hand out a copy.
        values = insert_call(graph, operator.getitem, (new, 0), before=topk, like=topk)
        values = insert_call(graph, torch.ops.aten.clone.default, (values,), before=topk, like=topk)
        experts = insert_call(graph, operator.getitem, (new, 1), before=topk, like=topk)
        if renorm is not None:  # the division's users take the op's renormalized values
            total, div = renorm
            div.replace_all_uses_with(values)
            graph.erase_node(div)
            graph.erase_node(total)
            report.count("routing_renorm")
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
