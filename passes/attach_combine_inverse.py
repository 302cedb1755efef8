"""Pass, attach the combine's inverse permutation: transformers' experts put their outputs back in
token order through `inv[perm] = arange(S)` (`inv = empty_like(perm)`, perm the indices of a
sort of the S = T * k expert ids), so `moe_combine(x, w, inv, k)`'s index is a permutation whose
inverse is `perm` itself. Given `idx_inverse=perm`, the op's backward reads each slot's gradient
in place (one term per row: one kernel, `row_scale`'s backward) instead of sorting `inv` to find
each row's slots and summing them (a radix sort and a gather pass per call). The same bits: a
one-term position-ordered sum is its term, +0.0 for -0.0 (`codegen/moe/combine.py`).

What is proven from the graph, or the node is left as it is:
- perm is `sort(t)[1]` of a 1-D t (a sort's indices are a permutation of 0..S-1), int64 [S];
- inv is `empty_like(perm)` (or `empty`) written once, by `inv[perm] = arange(S)` (Dynamo's
  setitem, or ATen's `index_put_` / `index_put`, whose result the combine may read), arange
  from 0 with step 1 and S values;
- nothing else writes inv or perm before the combine reads them."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, written_args
from .patterns import aliases_or_writes, is_op, sort_permutation
from .report import LoweringReport

aten = torch.ops.aten


def _arange_bounds(node):
    """(start, end, step) of an arange call, positional or keyword (torch.arange(end),
    (start, end[, step]), any of them as keywords; ATen's arange / .start / .start_step)."""
    pos = [a for a in node.args if not isinstance(a, (torch.dtype, torch.device))]
    kw = node.kwargs
    if len(pos) == 0:
        return kw.get("start", 0), kw.get("end"), kw.get("step", 1)
    if len(pos) == 1 and "end" not in kw:
        return kw.get("start", 0), pos[0], kw.get("step", 1)
    if len(pos) == 1:
        return pos[0], kw["end"], kw.get("step", 1)
    return pos[0], pos[1], pos[2] if len(pos) > 2 else kw.get("step", 1)


def _arange_of(node, length) -> bool:
    """node is arange(0, S, 1) of an integer dtype with S == length: the values 0..S-1."""
    if not is_op(node, functions=(torch.arange,), overloads=(aten.arange,)):
        return False
    val = fake(node)
    if val is None or val.dim() != 1 or val.dtype.is_floating_point or val.shape[0] != length:
        return False
    start, _, step = _arange_bounds(node)
    return type(start) is int and start == 0 and type(step) is int and step == 1


def _scatter_args(node):
    """(target, index, values) of `target[index] = values` (setitem / index_put(_)), else None."""
    if node.op != "call_function":
        return None
    if node.target is operator.setitem and len(node.args) == 3:
        return node.args
    if is_op(node, overloads=(aten.index_put_, aten.index_put)) and len(node.args) >= 3:
        indices = node.args[1]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if isinstance(indices, (list, tuple)) and len(indices) == 1 and not accumulate:
            return node.args[0], indices[0], node.args[2]
    return None


def _writes(node, tensor) -> bool:
    if node.op == "call_function" and node.target is operator.setitem:
        return node.args[0] is tensor
    flat = [a for x in written_args(node) for a in (x if isinstance(x, (list, tuple)) else (x,))]
    return tensor in flat


def _inverse_of(idx, combine, graph: fx.Graph):
    """perm when idx is proven to be the inverse permutation of perm at `combine`, else None."""
    if not isinstance(idx, fx.Node) or idx.op != "call_function":
        return None
    if is_op(idx, overloads=(aten.index_put, aten.index_put_)):  # idx = index_put(_)(inv, ...)
        scatter, base = idx, idx.args[0]
    else:
        base = idx
        writers = [u for u in idx.users if u.op == "call_function" and _writes(u, idx)]
        if len(writers) != 1:
            return None
        scatter = writers[0]
    if not is_op(
        base, functions=(torch.empty_like, torch.empty), overloads=(aten.empty_like, aten.empty)
    ):
        return None
    parts = _scatter_args(scatter)
    if parts is None or parts[0] is not base:
        return None
    _, perm, values = parts
    if not sort_permutation(perm) or fake(base) is None:
        return None
    if fake(base).shape != fake(perm).shape or not _arange_of(values, fake(perm).shape[0]):
        return None
    if any(aliases_or_writes(u, perm) for u in perm.users if u is not scatter):
        return None  # a view of perm, or a write: it may not be the permutation by then
    if any(u not in (scatter, combine, idx) for t in (base, idx) for u in t.users):
        return None  # inv read, viewed or written by anything else
    order = {n: i for i, n in enumerate(graph.nodes)}
    if not order[scatter] < order[combine]:
        return None
    for node in graph.nodes:  # no other write of inv or perm before the combine reads them
        if node is combine:
            break
        if node is not scatter and any(_writes(node, t) for t in (base, idx, perm)):
            return None
    return perm


def attach_combine_inverse(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport):
    ops = torch.ops.fp4_compile
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not ops.moe_combine.default:
            continue
        if node.kwargs.get("idx_inverse") is not None or len(node.args) > 5:
            continue
        perm = _inverse_of(node.args[2], node, graph)
        if perm is None:
            continue
        node.kwargs = {**node.kwargs, "idx_inverse": perm}
        report.count("combine_inverse_attached")
    gm.recompile()
