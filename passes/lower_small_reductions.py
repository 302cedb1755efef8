"""Pass, lower sums: a floating-point `sum` left in the graph becomes `fp4_compile::ordered_sum`
ops, which add in a fixed written-out order; stock kernels (eager or Inductor) would each choose
their own order.

- Over one static dimension of at most `MAX_EXTENT` elements (MoE's top-k combine, the top-k
  renormalization): one `ordered_sum`.
- Over one longer static dimension, or over all elements or several adjacent dimensions (the
  MoE load-balancing loss: the router probabilities summed over every token, at any token
  count; its final sum over the experts): a fixed tree of `ordered_sum`s. The reduced dimension
  (the adjacent dimensions merged into one) is cut into chunks of `MAX_EXTENT` from its start,
  each chunk summed in order, the last shorter chunk summed likewise, and the chunk sums
  reduced again the same way until one is left. The order is a function of the extent alone.
  Sums over at most `TINY_REDUCTION` (passes/verify.py) elements in all that are not over one dimension stay as
  they are (verify accepts them; their bits never depended on this pass).

Other reductions are left for verify to report.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..codegen.invariant.ordered_sum import MAX_EXTENT
from ..recipe import NVFP4Recipe
from .graph_utils import fake, insert_call, replace_with_call
from .patterns import is_op, scalar_arg
from .report import LoweringReport
from .verify import TINY_REDUCTION

aten = torch.ops.aten


def _is_sum(node) -> bool:
    return is_op(node, functions=(torch.sum,), methods=("sum",), overloads=(aten.sum,))


def _reduced_dims(node: fx.Node, ndim: int) -> list[int] | None:
    """The dimensions a sum reduces, sorted (all of them for a full sum), or None if unknown."""
    dim = scalar_arg(node, 1, "dim")
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    if not isinstance(dim, (list, tuple)) or not all(isinstance(d, int) for d in dim):
        return None
    return sorted({d % max(ndim, 1) for d in dim})


def _names_one_dim(node: fx.Node) -> bool:
    """A sum over one dimension named in the call (`x.sum(0)`, `dim=[1]`), not a full sum."""
    dim = scalar_arg(node, 1, "dim")
    return isinstance(dim, int) or (isinstance(dim, (list, tuple)) and len(dim) == 1)


def ordered_sum_tree(
    graph: fx.Graph, x: fx.Node, dim: int, *, keepdim: bool, before: fx.Node, max_extent: int
) -> fx.Node:
    """Nodes (inserted before `before`) that sum `x` over `dim` with `ordered_sum`s: chunks of
    `max_extent` from the start, each in order, then the chunk sums the same way."""
    ordered_sum = torch.ops.fp4_compile.ordered_sum.default

    def call(target, *args):
        return insert_call(graph, target, args, before=before, like=before)

    shape = list(fake(x).shape)
    extent = shape[dim]
    if extent <= max_extent:
        return call(ordered_sum, x, dim, keepdim)
    num_full, rest = divmod(extent, max_extent)
    full = x if rest == 0 else call(aten.narrow.default, x, dim, 0, num_full * max_extent)
    chunks = call(
        aten.reshape.default, full, [*shape[:dim], num_full, max_extent, *shape[dim + 1 :]]
    )
    partials = call(ordered_sum, chunks, dim + 1, False)  # [..., num_full, ...]
    if rest:
        tail = call(aten.narrow.default, x, dim, num_full * max_extent, rest)
        partials = call(aten.cat.default, [partials, call(ordered_sum, tail, dim, True)], dim)
    return ordered_sum_tree(
        graph, partials, dim, keepdim=keepdim, before=before, max_extent=max_extent
    )


def lower_small_reductions(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if not _is_sum(node) or not node.args:
            continue
        src = fake(node.args[0])
        if src is None or not src.dtype.is_floating_point:
            continue
        if scalar_arg(node, 3, "dtype") is not None and node.op != "call_method":
            continue
        if node.op == "call_method" and node.kwargs.get("dtype") is not None:
            continue
        dims = _reduced_dims(node, src.dim())
        if dims is None or src.dim() == 0:
            continue
        extents = [src.shape[d] for d in dims]
        if not all(isinstance(e, int) for e in extents):
            continue  # symbolic: verify reports it
        extent = math.prod(extents)
        keepdim = bool(scalar_arg(node, 2, "keepdim", False))
        one_dim = _names_one_dim(node)
        if one_dim and 1 <= extent <= MAX_EXTENT:  # one ordered_sum
            replace_with_call(
                graph,
                node,
                torch.ops.fp4_compile.ordered_sum.default,
                (node.args[0], dims[0], keepdim),
            )
            report.count("ordered_sum")
            continue
        adjacent = dims == list(range(dims[0], dims[-1] + 1))
        if extent < 1 or not adjacent or (not one_dim and extent <= TINY_REDUCTION):
            continue
        x, d = node.args[0], dims[0]
        if len(dims) > 1:  # merge the reduced dimensions into one
            merged = [*src.shape[:d], extent, *src.shape[dims[-1] + 1 :]]
            x = insert_call(graph, aten.reshape.default, (x, merged), before=node, like=node)
        out = ordered_sum_tree(graph, x, d, keepdim=False, before=node, max_extent=MAX_EXTENT)
        if keepdim:
            kept = [1 if i in dims else s for i, s in enumerate(src.shape)]
            out = insert_call(graph, aten.reshape.default, (out, kept), before=node, like=node)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        report.count("ordered_sum_tree")
    gm.recompile()
