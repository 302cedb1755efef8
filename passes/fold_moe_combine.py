"""Pass, fold the MoE top-k combine: `ordered_sum(view(gather_rows(row_scale(x, w), idx),
[T, k, H]), 1)` (transformers' experts: the routing weights times the expert outputs, back to
token order, summed over each token's k slots), each intermediate read by nothing else, becomes
`fp4_compile::moe_combine(x, w, idx, k)`: one pass over x forward, and a backward that reads
the token gradients directly instead of an expanded [T * k, H] copy; the same bits as the four
ops (`codegen/moe/combine.py`)."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, known_equal, replace_with_call, written_between
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten


def _is_reshape(node) -> bool:
    return is_op(
        node, methods=("view", "reshape"), overloads=(aten.view, aten.reshape, aten._unsafe_view)
    )


def _sole_input(node, target):
    """node.args[0] when it is a call of `target` read only by `node`, else None."""
    src = node.args[0] if node.args else None
    if isinstance(src, fx.Node) and src.op == "call_function" and src.target is target:
        return src if len(src.users) == 1 else None
    return None


def fold_moe_combine(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    ops = torch.ops.fp4_compile
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not ops.ordered_sum.default:
            continue
        if len(node.args) != 3 or node.kwargs or node.args[1:] != (1, False):
            continue
        view = node.args[0]
        if not (isinstance(view, fx.Node) and _is_reshape(view) and len(view.users) == 1):
            continue
        gathered = _sole_input(view, ops.gather_rows.default)
        scaled = gathered and _sole_input(gathered, ops.row_scale.default)
        if not scaled:
            continue
        x, w = scaled.args
        idx = gathered.args[1]
        fx_, fw, fv, fi = fake(x), fake(w), fake(view), fake(idx)
        if None in (fx_, fw, fv, fi) or fx_.dim() != 2 or fv.dim() != 3:
            continue
        s, h = fx_.shape
        t, k, hv = fv.shape
        if not isinstance(k, int):  # the op's slot count; the token counts may be symbols
            continue
        if not (
            known_equal(hv, h)
            and known_equal(t * k, s)
            and fw.dim() == 2
            and known_equal(fw.shape[0], s)
            and known_equal(fw.shape[1], 1)
            and fi.dim() == 1
            and known_equal(fi.shape[0], s)
        ):
            continue
        if written_between(graph, scaled, node, (x, w, idx)):
            continue  # the op would read them after a write row_scale / the gather did not see
        replace_with_call(graph, node, ops.moe_combine.default, (x, w, idx, k))
        for dead in (view, gathered, scaled):
            graph.erase_node(dead)
        report.count("moe_combine_folded")
    gm.recompile()
