"""Pass, lower embeddings: a token-embedding lookup (`F.embedding` in Dynamo graphs,
`aten.embedding` in exported ones) becomes `fp4_compile::embedding`, whose backward is one
opaque op (codegen/invariant/embedding.py): eager and Inductor then sum repeated tokens' gradients
with the same kernel. Lookups with max_norm, scale_grad_by_freq or sparse gradients are left as
they are and named in the report's notes."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import replace_with_call
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten


def _operands(node):
    """(weight, ids, padding_idx) of a plain lookup, or (None, reason)."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        names = ("weight", "indices", "padding_idx", "scale_grad_by_freq", "sparse")
        args = dict(zip(names, node.args)) | dict(node.kwargs)
        extra = {k: args.get(k, False) for k in ("scale_grad_by_freq", "sparse")}
        padding = args.get("padding_idx", -1)
        weight, ids = args.get("weight"), args.get("indices")
    else:
        names = (
            "input",
            "weight",
            "padding_idx",
            "max_norm",
            "norm_type",
            "scale_grad_by_freq",
            "sparse",
        )
        args = dict(zip(names, node.args)) | dict(node.kwargs)
        extra = {k: args.get(k) for k in ("max_norm", "scale_grad_by_freq", "sparse")}
        padding = args.get("padding_idx")
        weight, ids = args.get("weight"), args.get("input")
    used = [k for k, v in extra.items() if v not in (None, False)]
    if used:
        return None, f"embedding with {', '.join(used)} left as is"
    if padding is None:
        padding = -1
    if not isinstance(padding, int) or not isinstance(weight, fx.Node):
        return None, "embedding with a traced padding_idx or weight left as is"
    return (weight, ids, padding), None


def lower_embeddings(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if not is_op(
            node,
            functions=(torch.nn.functional.embedding, torch.embedding),
            overloads=(aten.embedding,),
        ):
            continue
        operands, why = _operands(node)
        if operands is None:
            report.notes.append(f"{node.name}: {why}")
            continue
        replace_with_call(graph, node, torch.ops.fp4_compile.embedding.default, operands)
        report.count("embedding")
    gm.recompile()
