"""Pass, lower row gathers: x[idx] with a 1-D integer index tensor along dim 0 of a floating x
of >= 2 dims (the MoE experts' `hidden_states[perm // top_k]` and `weighted_out[inv_perm]`)
becomes `fp4_compile::gather_rows`. The forward is the same ATen gather; the backward sums each
row's gradients in position order (codegen/invariant/gather_rows.py), where `x[idx]`'s autograd
would leave the scatter-add to the sort-based ATen kernel of whichever engine runs it."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, replace_with_call
from .report import LoweringReport

aten = torch.ops.aten


def _gather_operands(node: fx.Node):
    """(x, idx) when the node is x[idx] (getitem or aten.index.Tensor) with idx a 1-D integer
    tensor and x floating of >= 2 dims, else None."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem and len(node.args) == 2:
        x, idx = node.args
    elif node.target is aten.index.Tensor and len(node.args) == 2:
        x, indices = node.args
        if not isinstance(indices, (list, tuple)) or len(indices) != 1:
            return None
        (idx,) = indices
    else:
        return None
    fx_, fi = fake(x), fake(idx)
    if fx_ is None or fi is None:
        return None
    if not fx_.dtype.is_floating_point or fx_.dim() < 2:
        return None
    if fi.dim() != 1 or fi.dtype not in (torch.int64, torch.int32):
        return None
    return x, idx


def lower_gathers(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        operands = _gather_operands(node)
        if operands is None:
            continue
        replace_with_call(graph, node, torch.ops.fp4_compile.gather_rows.default, operands)
        report.count("gather_rows")
    gm.recompile()
