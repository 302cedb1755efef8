"""Inference graphs run a fused group's BF16 linears as ONE `invariant_linear` (not in PIPELINE:
a rollout engine's weight store runs it on its graphs, `rollout/store_binding.py`, and only on
graphs that track no gradient: the learner's graphs keep one GEMM per linear). The BF16
counterpart of `fuse_group_gemms.py` (NVFP4), for the linears the recipe keeps in BF16 (all of
them with quantize=False).

The members of a group (`weight_policy.FUSED_GROUPS`: q/k/v of one attention, gate/up of one
MLP) read the same X, and their weights are row ranges of ONE buffer [N_total, K] (the members
in group order: `rollout/bf16_groups.py`). Their linears become one linear of X by that
buffer, y [.., N_total], and each member's output is a view of it, `y[..., start:end]`. The
same bits, column for column: every output column is the dot product of X's row with ONE weight
row, accumulated in FP32 in the order pinned for (K, the op) alone, then rounded once to
out_dtype (DESIGN.md, alignment 2.): the CPU reference sums k = 0..K-1 in order for each
(row, column) whatever the column chunk (`invariant/reference.linear`); the CUDA kernel walks K
in BLOCK_K steps from 0 per output tile, BLOCK_K pinned per architecture, the tile's N range
never in the chain (`invariant/linear_kernel.py`). A weight read through a cast
(`_to_copy(w, dtype=bf16)`, a model not held in BF16) is read as ONE cast of the buffer:
elementwise, the same values.
(tests/passes/test_fuse_group_linears.py; the kernel in the interpreter:
tests/codegen/invariant/test_fused_group_linear.py.)

Left as they are, with the reason in the report's notes: a group whose members are not all in
the graph, read different X operands, carry a bias, or differ in the weight's cast or the
output dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from .graph_utils import erase_dead, insert_call, is_call, module_path
from .report import LoweringReport

# what `layout(weight node)` says of a member's weight: (the group's key, the member's position
# in the buffer, the number of members, its first row, its rows)
Layout = tuple[object, int, int, int, int]


def _linear_op():
    return torch.ops.fp4_compile.invariant_linear.default


def _cast_of(node) -> tuple[object, tuple]:
    """(the tensor a `_to_copy` reads, its kwargs as a key) or (node, ()) for anything else."""
    if isinstance(node, fx.Node) and is_call(node, torch.ops.aten._to_copy.default):
        if len(node.args) == 1:
            return node.args[0], tuple(sorted(node.kwargs.items(), key=lambda kv: kv[0]))
    return node, ()


def _weight(node: fx.Node) -> tuple[object, tuple]:
    """(the weight the linear reads, before a cast; the cast's key)."""
    return _cast_of(node.args[1])


def fuse_group_linears(
    graph: fx.Graph,
    layout: Callable[[fx.Node], Layout | None],
    buffer: Callable[[object], fx.Node],
    report: LoweringReport | None = None,
) -> int:
    """Fuse every group of `invariant_linear`s whose weights `layout` places in one buffer;
    returns how many groups were fused. `buffer(key)` gives the buffer's node (a placeholder
    the caller owns)."""
    groups: dict[object, dict[int, fx.Node]] = {}
    sizes: dict[object, int] = {}
    rows: dict[fx.Node, tuple[int, int]] = {}
    for node in graph.nodes:
        if not is_call(node, _linear_op()):
            continue
        w, _ = _weight(node)
        where = layout(w) if isinstance(w, fx.Node) else None
        if where is None:
            continue
        key, pos, count, start, n = where
        groups.setdefault(key, {})[pos] = node
        sizes[key] = count
        rows[node] = (start, n)
    fused = 0
    order = {n: i for i, n in enumerate(graph.nodes)}
    for key, members in groups.items():
        nodes = [members.get(i) for i in range(sizes[key])]
        reason = _refuse(nodes)
        if reason:
            if report is not None:
                names = ", ".join(module_path(n) or "<root>" for n in members.values())
                report.notes.append(f"not fused into one linear ({reason}): {names}")
            continue
        _fuse(graph, nodes, [rows[n] for n in nodes], buffer(key), order)
        fused += 1
        if report is not None:
            report.count("linear_groups_fused")
            report.count("gemm_launches_saved", len(nodes) - 1)
            names = ", ".join(module_path(n) or "<root>" for n in nodes)
            report.notes.append(f"one linear for {names}")
    return fused


def _refuse(nodes: list[fx.Node | None]) -> str:
    """Why these linears (in buffer order) cannot run as one, or ''."""
    if any(n is None for n in nodes):
        return "not every member of the group is a linear of this graph"
    if len({_cast_of(n.args[0]) for n in nodes}) != 1:
        return "the members read different X operands"
    if any(n.args[2] is not None for n in nodes):
        return "a member has a bias"
    if len({(_weight(n)[1], n.args[3]) for n in nodes}) != 1:
        return "the members cast their weights or their outputs differently"
    return ""


def _new_val(like: torch.Tensor, shape, dtype):
    with like.fake_mode if hasattr(like, "fake_mode") else contextlib.nullcontext():
        return like.new_empty(tuple(shape), dtype=dtype)


def _fuse(graph, nodes, spans, buf: fx.Node, order) -> None:
    first = min(nodes, key=order.__getitem__)
    x, out_dtype = first.args[0], first.args[3]
    w = buf
    _, cast = _weight(first)
    if cast:  # the model's dtype is not BF16: one cast of the buffer instead of one per member
        with graph.inserting_before(first):
            w = graph.call_function(torch.ops.aten._to_copy.default, (buf,), dict(cast))
        bv = buf.meta["val"]
        w.meta["val"] = _new_val(bv, bv.shape, dict(cast).get("dtype", bv.dtype))
    with graph.inserting_before(first):
        fused = graph.call_function(_linear_op(), (x, w, None, out_dtype))
    # N_total wide (not propagated: a bound graph's store inputs carry values of the binding's
    # fake mode, its other nodes the lowering's)
    fused.meta.update(first.meta)
    v = first.meta["val"]
    val = _new_val(v, (*v.shape[:-1], sum(n for _, n in spans)), v.dtype)
    fused.meta["val"] = val
    if "example_value" in fused.meta:
        fused.meta["example_value"] = val
    for node, (start, n) in zip(nodes, spans):
        part = insert_call(
            graph,
            torch.ops.aten.slice.Tensor,
            (fused, -1, start, start + n),
            before=first,
            like=node,
        )
        node.replace_all_uses_with(part)
    reads = [n.args[1] for n in nodes] + [n.args[0] for n in nodes]
    erase_dead(graph, [*nodes, *(r for r in reads if isinstance(r, fx.Node))])
