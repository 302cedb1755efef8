"""Pass, fuse residual adds: a decoder layer's residual add `h = x + residual` read by the
RMSNorm after it (the next block's input norm, the final norm) is computed by that norm's
launch, which also returns h for its other readers (the next residual add):

    rms_norm_quantize(x + r, w, eps, ...)  -> add_rms_norm_quantize(x, r, w, eps, ...)
    invariant_rms_norm(x + r, w, eps)      -> invariant_add_rms_norm(x, r, w, eps)

The sum is the same one rounding (FP32 sum of the two, rounded once to their dtype: the model's
add, Inductor's and the kernels' `rms_norm_row` HAS_RES), so every output keeps its bits
(tests/passes/test_fuse_residual_adds.py); the fused ops' backward is the norm's plus the
gradient of h, to both addends. Only plain adds of two tensors of the output's shape and dtype
(no alpha, no broadcast, no type promotion). The fused op takes the add's place (the norm's
other inputs come first: its weight), so readers of h between the two (an exported graph's
metadata asserts) keep reading it. Runs in every graph (learner and rollout alike: the op
census stays equal, tests/rollout/test_export.py); `explain` counts `residual_add_fused`.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..recipe import NVFP4Recipe
from .graph_utils import fake, insert_call
from .patterns import is_add
from .report import LoweringReport


def _ops():
    return torch.ops.fp4_compile


def _addends(add: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(x, residual) of a plain same-shape, same-dtype add of two tensors, else None."""
    if not is_add(add) or len(add.args) != 2 or add.kwargs:
        return None
    a, b = add.args
    va, vb, out = fake(a), fake(b), fake(add)
    if va is None or vb is None or out is None:
        return None
    if not (va.shape == vb.shape == out.shape and va.dtype == vb.dtype == out.dtype):
        return None
    return a, b


def _fused_target(norm: fx.Node):
    """The residual form of norm node `norm`'s op, and the index of its h output; else None."""
    if norm.op != "call_function" or norm.kwargs:
        return None
    if norm.target is _ops().rms_norm_quantize.default:
        return _ops().add_rms_norm_quantize.default, 5
    if norm.target is _ops().invariant_rms_norm.default:
        return _ops().invariant_add_rms_norm.default, 1
    return None


def _fuse(graph: fx.Graph, norm: fx.Node, order: dict) -> bool:
    found = _fused_target(norm)
    add = norm.args[0] if norm.args else None
    addends = _addends(add) if isinstance(add, fx.Node) else None
    if found is None or addends is None:
        return False
    target, h_index = found
    args = (*addends, *norm.args[1:])
    if all(order[a] < order[add] for a in norm.args[1:] if isinstance(a, fx.Node)):
        # in the add's place: readers of h before the norm (an exported graph's metadata
        # asserts, casts) read it from there
        fused = insert_call(graph, target, args, after=add, like=norm)
    elif any(order[u] < order[norm] for u in add.users):  # read before the norm, which cannot move
        return False
    else:
        fused = insert_call(graph, target, args, before=norm, like=norm)
    if norm.target is _ops().invariant_rms_norm.default:  # one output -> output 0 of two
        y = insert_call(graph, operator.getitem, (fused, 0), before=norm, like=norm)
        norm.replace_all_uses_with(y)
    else:  # the same outputs 0..4, h appended
        norm.replace_all_uses_with(fused)
    graph.erase_node(norm)
    h = insert_call(graph, operator.getitem, (fused, h_index), after=fused, like=add)
    add.replace_all_uses_with(h)
    graph.erase_node(add)
    return True


def fuse_residual_adds(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    for norm in list(graph.nodes):
        if _fuse(graph, norm, order):
            order = {n: i for i, n in enumerate(graph.nodes)}  # new nodes took places
            report.count("residual_add_fused")
    gm.recompile()
