"""Pass, lower row scales: a floating multiply x[..., H] * w[..., 1] whose leading dims match
(MoE: expert outputs times their routing weights) becomes `fp4_compile::row_scale`. The forward
is the same multiply; the op's backward reduces grad * x over H in a fixed order, where a plain
multiply's autograd would leave that sum to the stock kernel of whichever engine runs it."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, replace_with_call
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten


def _is_mul(node) -> bool:
    return is_op(node, functions=(operator.mul, torch.mul), methods=("mul",), overloads=(aten.mul,))


def _row_scale_operands(node):
    """(x, w) when the multiply is x[..., H>1] * w[..., 1] with equal leading dims, else None."""
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    fa, fb = fake(a), fake(b)
    if fa is None or fb is None:
        return None
    for x, w, fx_, fw in ((a, b, fa, fb), (b, a, fb, fa)):
        if not (fx_.dtype.is_floating_point and fw.dtype.is_floating_point):
            return None
        if fx_.dim() < 2 or fw.dim() != fx_.dim():
            continue
        h = fx_.shape[-1]
        if not isinstance(h, int) or h < 2 or fw.shape[-1] != 1:
            continue
        if tuple(fw.shape[:-1]) != tuple(fx_.shape[:-1]):
            continue
        return x, w
    return None


def lower_row_scales(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if not _is_mul(node):
            continue
        operands = _row_scale_operands(node)
        if operands is None:
            continue
        replace_with_call(graph, node, torch.ops.fp4_compile.row_scale.default, operands)
        report.count("row_scale")
    gm.recompile()
