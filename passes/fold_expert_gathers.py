"""Pass, fold expert gathers: `nvfp4_grouped_mm(gather_rows(h, idx), ...)`, where the gathered
copy has no other reader (the experts' `hidden_states[perm // top_k]`), becomes
`nvfp4_grouped_mm(h, ..., x_index=idx)`. The op then quantizes h once per token (1x16 blocks
are row-local, so a gathered row's quantization is its source row's; a per-tensor amax is taken
over the gathered rows only) and gathers the on-grid rows in the GEMM's operand load; its
backward reads X^T through the index and returns h's gradient with `gather_rows`' own
position-ordered sums. The same bits as the unfolded graph, without the top_k-times gathered
copy of h, its quantize and its amax (an MoE layer of the learner: 8x the tokens).
A whole-row zero fill of the gathered copy (transformers 5.17's experts always apply their
expert-parallel sentinel mask, `masked_fill_(mask, 0.0)`) folds in as index -1: the op's zero
row. When the gather index is `perm // top_k` of a sort permutation that nothing writes,
perm rides along (`x_perm`): the backward finds each token's gathered positions through its
inverse instead of sorting the index (`codegen/nvfp4/expert_gather_backward_kernel.py`), the same
bits.
The BF16 experts' GEMM of the bf16 recipe (`invariant_grouped_mm`) folds its gather the same way
(`x_index`, read by the kernel's operand load), where the gathered copy is read by that GEMM
alone: the same rows, so the same products; its backward is the unfolded graph's
(`invariant_grouped_mm_backward` on the gathered rows, then `gather_rows_backward`). An index
that is one of `expert_order`'s (never negative) is read as it is; another is wrapped first."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..codegen.nvfp4.gemm_call import GemmCall, is_gemm
from ..recipe import NVFP4Recipe
from .graph_utils import (
    fake,
    insert_call,
    known_equal,
    size_arg,
    written_args,
    written_between,
)
from .patterns import floordiv_of_sort_permutation, is_cast, is_masked_fill, row_zero_mask
from .report import LoweringReport
from .targets import replace_gemm

aten = torch.ops.aten


def _source(x: fx.Node, gemm: fx.Node):
    """From the GEMM's input back to a gather: (gather node, the nodes in between, row mask or
    None), or None. In between: dtype-preserving casts (the experts call `.to(weight.dtype)`)
    and at most one whole-row zero fill (the sentinel mask: a functional `masked_fill` in an
    exported graph, or `masked_fill_` in place on the gathered copy in a Dynamo graph, then a
    second reader of the gather node); every one of them read by nothing else."""
    ops = torch.ops.fp4_compile
    chain, mask = [], None
    while not (x.op == "call_function" and x.target is ops.gather_rows.default):
        src = x.args[0] if x.args else None
        if len(x.users) != 1 or not isinstance(src, fx.Node) or fake(src) is None:
            return None
        if is_masked_fill(x) and mask is None and not written_args(x):
            mask = row_zero_mask(x, fake(src).shape[0])
            if mask is None:
                return None
        elif not (is_cast(x) and fake(x) is not None and fake(src).dtype == fake(x).dtype):
            return None  # a real conversion: the GEMM quantizes the converted values
        chain.append(x)
        x = src
    reader = chain[-1] if chain else gemm
    others = [u for u in x.users if u is not reader]
    if others:  # only an in-place row fill of the gathered copy, before the GEMM side reads it
        fill = others[0]
        order = {n: i for i, n in enumerate(x.graph.nodes)}
        if not (
            len(others) == 1
            and mask is None
            and is_masked_fill(fill)
            and written_args(fill) == [x]
            and not fill.users
            and order[fill] < order[reader]
        ):
            return None
        mask = row_zero_mask(fill, fake(x).shape[0] if fake(x) is not None else None)
        if mask is None:
            return None
        chain.append(fill)
    return x, chain, mask


def _nonnegative(idx) -> bool:
    """Whether `idx` is never negative: `perm // top_k` of a sort permutation, or an output
    of `fp4_compile::expert_order` that is one (its perm, inverse or token index)."""
    if floordiv_of_sort_permutation(idx) is not None:
        return True
    return (
        isinstance(idx, fx.Node)
        and idx.op == "call_function"
        and idx.target is operator.getitem
        and isinstance(idx.args[0], fx.Node)
        and idx.args[0].target is torch.ops.fp4_compile.expert_order.default
        and idx.args[1] in (1, 3, 4)
    )


def _wrapped(graph: fx.Graph, idx: fx.Node, h: fx.Node, node: fx.Node) -> fx.Node:
    """x[idx]'s index with negative entries wrapped (the op's -1 is a zero row)."""
    negative = insert_call(graph, aten.lt.Scalar, (idx, 0), before=node, like=node)
    rows_arg = size_arg(graph, h, 0, before=node)
    wrapped = insert_call(graph, aten.add.Scalar, (idx, rows_arg), before=node, like=node)
    return insert_call(graph, aten.where.self, (negative, wrapped, idx), before=node, like=node)


def _fold_bf16(graph: fx.Graph, node: fx.Node, report: LoweringReport) -> None:
    """invariant_grouped_mm(gather_rows(h, idx), w, offsets, dtype) -> (h, ..., x_index=idx),
    through dtype-preserving casts only (a row fill in between: left as it is)."""
    if len(node.args) != 4 or node.kwargs or not isinstance(node.args[0], fx.Node):
        return
    found = _source(node.args[0], node)
    if found is None or found[2] is not None:
        return
    gathered, chain, _ = found
    h, idx = gathered.args
    if fake(h) is None or written_between(graph, gathered, node, (h, idx)):
        return
    if not _nonnegative(idx):
        idx = _wrapped(graph, idx, h, node)
    folded = insert_call(
        graph,
        torch.ops.fp4_compile.invariant_grouped_mm.default,
        (h, *node.args[1:], idx),
        before=node,
        like=node,
    )
    node.replace_all_uses_with(folded)
    graph.erase_node(node)
    for dead in [*chain, gathered]:  # GEMM side first: each one's only reader is gone
        if not dead.users:
            graph.erase_node(dead)
    report.count("expert_gather_folded")


def fold_expert_gathers(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if (
            node.op == "call_function"
            and node.target is torch.ops.fp4_compile.invariant_grouped_mm.default
        ):
            _fold_bf16(graph, node, report)
            continue
        if not is_gemm(node, "nvfp4_grouped_mm") or node.kwargs:
            continue
        call = GemmCall.of(node)
        if call.x_index is not None or call.x_perm is not None:
            continue
        found = _source(call.x, node)
        if found is None:
            continue
        gathered, chain, mask = found
        h, idx = gathered.args
        if written_between(graph, gathered, node, (h, idx, mask)):
            continue  # the op would read them after a write the gather did not see
        if fake(h) is None:
            continue
        rows = fake(h).shape[0]  # an int, or a symbol under dynamic shapes
        source = floordiv_of_sort_permutation(idx)  # hidden_states[perm // top_k]
        perm = None
        if source is not None and known_equal(fake(source[0]).shape[0], rows * source[1]):
            perm = source[0]  # the backward finds each row's positions through its inverse
        # x[idx] wraps a negative index; the op's -1 is a zero row: wrap first (the experts'
        # indices are never negative; one fused elementwise kernel over [S] ints)
        idx = _wrapped(graph, idx, h, node)
        if mask is not None:  # masked rows: index -1, a zero row in the op
            rows_mask = insert_call(graph, aten.squeeze.dim, (mask, -1), before=node, like=node)
            idx = insert_call(
                graph, aten.where.ScalarSelf, (rows_mask, -1, idx), before=node, like=node
            )
        replace_gemm(graph, node, call._replace(x=h, x_index=idx, x_perm=perm))
        if perm is not None:
            report.count("expert_gather_perm_attached")
        for dead in chain:  # GEMM side first: each one's only reader is gone
            if not dead.users:
                graph.erase_node(dead)
        if not gathered.users:
            graph.erase_node(gathered)
        report.count("expert_gather_folded")
    gm.recompile()
