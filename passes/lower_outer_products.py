"""Pass, lower outer products: a matmul whose contraction dimension is 1 (transformers' rotary
embedding computes `inv_freq[:, None] @ positions[None, :]` this way in some versions) is a
broadcast multiply: every output is ONE product, no reduction, so `a * b` gives the same bits
and no stock GEMM kernel is left in the graph."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, replace_with_call
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten


def _is_matmul(node) -> bool:
    return is_op(
        node,
        functions=(torch.matmul, operator.matmul),
        methods=("matmul", "__matmul__"),
        overloads=(aten.matmul, aten.bmm, aten.mm),
    )


def lower_outer_products(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if not _is_matmul(node) or len(node.args) < 2:
            continue
        a, b = fake(node.args[0]), fake(node.args[1])
        if a is None or b is None or a.dim() < 2 or b.dim() < 2:
            continue
        if not (
            isinstance(a.shape[-1], int)
            and a.shape[-1] == 1
            and isinstance(b.shape[-2], int)
            and b.shape[-2] == 1
        ):
            continue
        replace_with_call(graph, node, aten.mul.Tensor, (node.args[0], node.args[1]))
        report.count("outer_product")
    gm.recompile()
