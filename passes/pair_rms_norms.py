"""Pass, pair RMSNorms: two consecutive `invariant_rms_norm` nodes of the same row length, eps
and dtype that do not read each other (an attention's q and k norms) become ONE launch:

    ya = invariant_rms_norm(a, wa, eps); yb = invariant_rms_norm(b, wb, eps)
        -> ya, yb = invariant_rms_norm_pair(a, wa, b, wb, eps)

Each row is computed by the same one-row code as before (`invariant/rms_norm_kernel.py`), and the
pair's backward is the two norms' backward ops, so every output and gradient keeps its bits
(tests/passes/test_pair_rms_norms.py). Only the NEXT invariant_rms_norm in graph order is a
candidate (pairs stay local); the pair runs where the second norm ran, and the first norm's
readers in between (a transpose) move after it; nothing that writes a tensor is moved, and no
pair forms across a write of the first norm's inputs. Runs in every graph (learner and rollout
alike: the op census stays equal); `explain` counts `rms_norms_paired`.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..recipe import NVFP4Recipe
from .graph_utils import fake, insert_call, written_args, written_between
from .report import LoweringReport


def _norm():
    return torch.ops.fp4_compile.invariant_rms_norm.default


def _key(norm: fx.Node):
    """What the two norms of a pair share: row length, eps, dtypes, whether weighted."""
    if norm.kwargs or len(norm.args) != 3:
        return None
    x, w, eps = norm.args
    vx, vw = fake(x), (fake(w) if isinstance(w, fx.Node) else None)
    if vx is None or (w is not None and vw is None):
        return None
    return (vx.shape[-1], vx.dtype, vx.device, float(eps), None if vw is None else vw.dtype)


def _between_readers(nodes: list[fx.Node], first: fx.Node, second: fx.Node) -> list | None:
    """The nodes after `first` and before `second` that read `first` (transitively), in order;
    None if `second` reads one of them or one of them writes a tensor (moving it is unsafe)."""
    i, j = nodes.index(first), nodes.index(second)
    readers, moved = {first}, []
    for n in nodes[i + 1 : j]:
        if any(x in readers for x in n.all_input_nodes):
            if n.op not in ("call_function", "call_method") or written_args(n):
                return None
            readers.add(n)
            moved.append(n)
    if any(x in readers for x in second.all_input_nodes):
        return None
    return moved


def _pair(graph: fx.Graph, first: fx.Node, second: fx.Node) -> bool:
    key = _key(first)
    if key is None or key != _key(second):
        return False
    moved = _between_readers(list(graph.nodes), first, second)
    if moved is None or written_between(graph, first, second, first.args[:2]):
        return False
    (a, wa, eps), (b, wb, _) = first.args, second.args
    target = torch.ops.fp4_compile.invariant_rms_norm_pair.default
    pair = insert_call(graph, target, (a, wa, b, wb, eps), before=second, like=second)
    ya = insert_call(graph, operator.getitem, (pair, 0), after=pair, like=first)
    yb = insert_call(graph, operator.getitem, (pair, 1), after=ya, like=second)
    first.replace_all_uses_with(ya)
    second.replace_all_uses_with(yb)
    graph.erase_node(first)
    graph.erase_node(second)
    cursor = yb
    for n in moved:  # the first norm's readers, in their order, after the pair
        cursor.append(n)
        cursor = n
    return True


def pair_rms_norms(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    pending = None  # the last unpaired invariant_rms_norm
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _norm():
            continue
        if pending is not None and _pair(graph, pending, node):
            report.count("rms_norms_paired")
            pending = None
        else:
            pending = node
    gm.recompile()
