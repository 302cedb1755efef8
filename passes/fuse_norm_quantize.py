"""Pass, fuse norm quantize: a `quantize_activation` (per-row scales, no static amax) whose input
is an `invariant_rms_norm`'s output becomes part of the norm, `fp4_compile::rms_norm_quantize`,
which writes the GEMMs' operand in its epilogue (the norm owns the whole row, so the row's amax
is known before its blocks are encoded): the separate quantize launch and its read of the
normed X disappear. The norm's output keeps every other reader. The same bits
(tests/passes/test_fuse_norm_quantize.py); `explain` counts `rms_norm_quantize_fused`."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import insert_call
from .report import LoweringReport


def _ops():
    from .. import codegen  # noqa: F401  (registers the fp4_compile ops)

    return torch.ops.fp4_compile


def _is(node, target) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is target


def fusable_norm(q: fx.Node) -> fx.Node | None:
    """The invariant_rms_norm node whose (detached) output quantize_activation node q reads,
    when the recipe scales activations per row and q takes no static amax; else None."""
    det, numerics, x_amax, _ = q.args
    if x_amax is not None or not _is(det, torch.ops.aten.detach.default):
        return None
    if NVFP4Recipe.from_numerics_key(numerics).activation.global_scale != "per_row":
        return None
    norm = det.args[0]
    return norm if _is(norm, _ops().invariant_rms_norm.default) else None


def fuse_norm_quantize(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    quantizes = [n for n in graph.nodes if _is(n, _ops().quantize_activation.default)]
    for q in quantizes:
        norm = fusable_norm(q)
        if norm is None or not all(_is(u, operator.getitem) for u in q.users):
            continue
        det, numerics, _, transposed = q.args
        x, weight, eps = norm.args
        fused = insert_call(graph, _ops().rms_norm_quantize.default,
                            (x, weight, eps, numerics, transposed), before=norm, like=norm)  # fmt: skip
        y = insert_call(graph, operator.getitem, (fused, 0), before=norm, like=norm)
        for item in list(q.users):
            out = insert_call(graph, operator.getitem, (fused, item.args[1] + 1), before=norm,
                              like=norm)  # fmt: skip
            item.replace_all_uses_with(out)
            graph.erase_node(item)
        graph.erase_node(q)
        if not det.users:
            graph.erase_node(det)
        norm.replace_all_uses_with(y)
        graph.erase_node(norm)
        report.count("rms_norm_quantize_fused")
    gm.recompile()
