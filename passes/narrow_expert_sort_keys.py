"""Pass, narrow expert-id sort keys: the stable sort of MoE expert ids (transformers' experts sort
the (token, expert) pairs with `torch.sort(expert_ids)`; the ids come from the routing op, so
0 <= id < E) sorts the ids as uint8 (E <= 256) or int16 (E <= 32767) and widens the sorted values
back. On CUDA the sort is cub's radix sort, one 8-bit pass per key byte: int64 ids cost eight
passes, uint8 one (H200 learner, 2026-12-04: 16 passes per step for two layers). A stable sort's
permutation is fixed by the key ORDER alone, which the narrowing keeps (every id fits), so the
indices and the widened values are the same tensors, bit for bit, on every implementation.

Runs after `lower_routing` (ids from `fp4_compile::invariant_routing`) and `stable_sorts`; a sort
whose keys do not trace back (through views) to the routing op's ids is left as it is."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, insert_call, propagate_val
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten
_VIEWS = ("reshape", "view", "flatten", "contiguous", "clone")


def _is_view(node) -> bool:
    return is_op(
        node,
        functions=(torch.reshape, torch.flatten),
        methods=_VIEWS,
        overloads=(aten.reshape, aten.view, aten._unsafe_view, aten.flatten, aten.clone),
    )


def _routing_experts(node) -> int | None:
    """E when `node` is (a view of) the expert ids of `fp4_compile::invariant_routing`."""
    while _is_view(node):
        node = node.args[0]
    if not (isinstance(node, fx.Node) and node.op == "call_function"):
        return None
    if node.target is not operator.getitem or node.args[1] != 1:
        return None
    routing = node.args[0]
    if not (isinstance(routing, fx.Node) and "invariant_routing" in str(routing.target)):
        return None
    logits = fake(routing.args[0])
    return None if logits is None else int(logits.shape[-1])


def _narrow_dtype(num_experts: int) -> torch.dtype | None:
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 32767:
        return torch.int16
    return None


def _is_stable_sort(node) -> bool:
    return is_op(node, functions=(torch.sort,), methods=("sort",)) or (
        node.op == "call_function" and node.target is aten.sort.stable
    )


def narrow_expert_sort_keys(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport):
    graph = gm.graph
    for node in list(graph.nodes):
        if not _is_stable_sort(node) or not node.kwargs.get("stable", False):
            continue
        keys = node.args[0]
        ids = fake(keys)
        experts = _routing_experts(keys)
        narrow = _narrow_dtype(experts) if experts is not None else None
        if narrow is None or ids is None or ids.dtype.is_floating_point:
            continue
        users = list(node.users)
        if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
            continue  # a tuple consumed whole (not seen in transformers): left as it is
        short = insert_call(
            graph, aten._to_copy.default, (keys,), before=node, like=node, kwargs={"dtype": narrow}
        )
        node.args = (short, *node.args[1:])
        for u in users:
            if u.args[1] != 0:
                continue  # the indices: unchanged
            wide = insert_call(
                graph, aten._to_copy.default, (u,), after=u, like=u, kwargs={"dtype": ids.dtype}
            )
            u.replace_all_uses_with(wide, delete_user_cb=lambda n, w=wide: n is not w)
        propagate_val(node)
        for u in users:
            propagate_val(u)
        report.count("narrow_expert_sort_keys")
    gm.recompile()
