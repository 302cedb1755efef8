"""Pass, fold the routing into the experts' order: in an inference graph (the rollout engine's
step, an exported rollout program), `fp4_compile::invariant_routing` (the router's softmax top-k)
whose weights and expert ids only `fp4_compile::expert_order` reads (what `fold_expert_order`
leaves in a decode step; through a clone of the weights only it reads: the same bits) becomes, with it, ONE `fp4_compile::routing_order`
(`codegen/moe/routing_order.py`): one launch instead of two, the same outputs bit for bit (the
same per-row routing code and the same bookkeeping code, in one program). Runs right after
`fold_expert_order`.

Left as it is, with the reason in the report's notes:
- a graph that needs the routing's gradient (grad enabled and an input, the router's weight,
  requiring it: the learner's training forward): routing_order has no backward, the two ops
  have theirs;
- routing outputs read by anything but that one expert_order (a top-k the model also returns,
  a weight clone, ...): the fused op does not produce them;
- an expert_order of other experts than the routing's (num_experts != the logits' E)."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, fake, insert_call, tracks_gradients
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten


def _readers(node: fx.Node) -> list[fx.Node]:
    """node's users but an exported graph's metadata asserts (erase_dead drops those)."""
    return [u for u in node.users if "assert_tensor_metadata" not in str(u.target)]


def _is_op(node, packet) -> bool:
    """node calls the op (its default overload, as passes insert it, or the packet, as Dynamo
    records a user's own call)."""
    return isinstance(node, fx.Node) and node.target in (packet, packet.default)


def _through_clones(values: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """(the node under `values`' clones, the clones): a clone is a copy of the same bits (an
    FP32 model's `weights.to(float32)`); `_refusal` checks that only the next node reads it."""
    clones = []
    while is_op(values, functions=(torch.clone,), methods=("clone",), overloads=(aten.clone,)):
        clones.append(values)
        values = values.args[0]
    return values, clones


def _routing_of(order: fx.Node):
    """(the invariant_routing node, its weights and ids getitems, the clones between the
    weights and `order`) that `order`'s values and experts are, else None."""
    experts, (values, clones) = order.args[0], _through_clones(order.args[1])
    parts = []
    for node, index in ((values, 0), (experts, 1)):
        if not (
            isinstance(node, fx.Node)
            and node.target is operator.getitem
            and node.args[1] == index
            and _is_op(node.args[0], torch.ops.fp4_compile.invariant_routing)
        ):
            return None
        parts.append(node)
    routing = parts[0].args[0]
    return (routing, *parts, clones) if parts[1].args[0] is routing else None


def _refusal(
    order: fx.Node,
    routing: fx.Node,
    weights: fx.Node,
    ids: fx.Node,
    clones: list[fx.Node],
    training: bool,
) -> str | None:
    logits = fake(routing.args[0])
    if logits is None:
        return "no example value of the router's logits"
    if training or (torch.is_grad_enabled() and logits.requires_grad):
        return "a graph that needs the routing's gradient (routing_order has no backward)"
    if int(order.args[2]) != int(logits.shape[-1]):
        return f"expert_order of {order.args[2]} experts, routing of {logits.shape[-1]}"
    if set(_readers(routing)) != {weights, ids}:
        return "the routing's outputs have other readers"
    chain = [weights, *reversed(clones), order]  # each read only by the next
    if any(_readers(a) != [b] for a, b in zip(chain, chain[1:])) or _readers(ids) != [order]:
        return "the routing's weights or ids have other readers than expert_order"
    return None


def fold_routing_order(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    fused = torch.ops.fp4_compile.routing_order.default
    refused: dict[str, int] = {}
    training = tracks_gradients(graph)
    for order in list(graph.nodes):
        if not _is_op(order, torch.ops.fp4_compile.expert_order):
            continue
        found = _routing_of(order)
        if found is None:
            continue
        routing, weights, ids, clones = found
        why = _refusal(order, routing, weights, ids, clones, training)
        if why is not None:
            refused[why] = refused.get(why, 0) + 1
            continue
        logits, top_k, norm = routing.args[:3]
        args = (logits, top_k, norm, order.args[3])
        new = insert_call(graph, fused, args, before=routing, like=order)
        order.replace_all_uses_with(new)  # the same five outputs, read by the same getitems
        erase_dead(graph, [order, *clones, weights, ids, routing])
        report.count("routing_order_folded")
    for why, n in refused.items():
        report.notes.append(f"routing not folded into expert_order at {n} site(s): {why}")
    gm.recompile()
