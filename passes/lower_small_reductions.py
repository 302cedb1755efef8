"""Pass, lower small reductions: a floating-point `sum` over one static dimension of at most
`MAX_EXTENT` elements (MoE's top-k combine, the top-k renormalization) becomes
`fp4_compile::ordered_sum`, which adds in a fixed written-out order; stock kernels (eager or
Inductor) would each choose their own order. Larger or multi-dim reductions are left for verify
to report."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, replace_with_call
from .patterns import is_op, scalar_arg
from .report import LoweringReport

aten = torch.ops.aten


def _is_sum(node) -> bool:
    return is_op(node, functions=(torch.sum,), methods=("sum",), overloads=(aten.sum,))


def lower_small_reductions(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    from ..codegen.invariant.ordered_sum import MAX_EXTENT

    graph = gm.graph
    for node in list(graph.nodes):
        if not _is_sum(node) or not node.args:
            continue
        src = fake(node.args[0])
        dim = scalar_arg(node, 1, "dim")
        if isinstance(dim, (list, tuple)) and len(dim) == 1:
            dim = dim[0]
        if src is None or not src.dtype.is_floating_point or not isinstance(dim, int):
            continue
        if scalar_arg(node, 3, "dtype") is not None and node.op != "call_method":
            continue
        extent = src.shape[dim]
        if not isinstance(extent, int) or not 1 <= extent <= MAX_EXTENT:
            continue
        keepdim = bool(scalar_arg(node, 2, "keepdim", False))
        replace_with_call(
            graph, node, torch.ops.fp4_compile.ordered_sum.default,
            (node.args[0], dim % src.dim(), keepdim),
        )  # fmt: skip
        report.count("ordered_sum")
    gm.recompile()
