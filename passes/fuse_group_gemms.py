"""Inference graphs run a fused group's GEMMs as ONE GEMM (not in PIPELINE: a rollout engine's
weight store runs it on its graphs after `bind_weight_inputs`, `rollout/store_binding.py`, and
only on graphs that track no gradient: the learner's graphs keep one GEMM per linear).

The members of a shared-scale group (`weight_policy.FUSED_GROUPS`: q/k/v of one attention,
gate/up of one MLP) read the same X with the same quantization (`share_activation_quantize`),
and their packed weights are rows of ONE buffer of the store (codes [N_total, K/2], E4M3 block
scale bytes [N_total, K/16], the members in group order; `weight_store.py`). Their GEMMs
become one GEMM of X by that buffer, y [.., N_total], and each member's output is a view of it,
`y[..., start:end]`. The same bits, column for column:
- every output column is the dot product of X's row with ONE weight row, summed in the order
  pinned for (K, the op) alone (DESIGN.md, alignment 2.): no K chain depends on N (the CPU
  reference computes each dot product exactly, `reference._exact_int_mm`; the CUDA decode
  kernel's tiles and K chunks are picked from M and K, its split count is speed only);
- the epilogue multiplies by X's global decode and the weight's, and the members share one
  weight global scale (the group amax: their global decodes are equal, bit for bit), so the
  fused GEMM's epilogue is each member's.
(tests/passes/test_fuse_group_gemms.py; the decode kernel in the interpreter:
tests/codegen/nvfp4/test_fused_group_gemm.py.)

Left as they are, with the reason in the report's notes: a group whose members are not all in
the graph, read different X operands, carry a bias or an on-grid copy, or whose store entries are
not adjacent rows of one buffer (`layout` says None).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen.nvfp4.gemm_call import GemmCall, QuantizedWeight, encode_recipe, is_gemm
from .graph_utils import erase_dead, insert_call, module_path
from .report import LoweringReport

# what `layout(codes node)` says of a member's packed codes: (the group's key, the member's
# position in the buffer, the number of members, its first row, its rows)
Layout = tuple[object, int, int, int, int]
# the buffer's (codes, scale bytes as uint8) nodes for a group key, made on demand
BufferNodes = Callable[[object], tuple[fx.Node, fx.Node]]

_OPS = ("nvfp4_linear_quantized", "nvfp4_linear")


def _gemms(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if any(is_gemm(n, op) for op in _OPS)]


def _x_key(node: fx.Node, call: GemmCall) -> tuple:
    """What must be equal for two GEMMs to share one X: the op, X (or its given operands), the
    static amax and the recipe."""
    operands = tuple(call.x_operands) if call.x_operands is not None else ()
    return (node.target, call.x, operands, call.x_amax, encode_recipe(call.recipe))


def fuse_group_gemms(
    graph: fx.Graph,
    layout: Callable[[fx.Node], Layout | None],
    buffers: BufferNodes,
    report: LoweringReport | None = None,
) -> int:
    """Fuse every group of GEMMs whose weights `layout` places in one buffer; returns how many
    groups were fused. `buffers(key)` gives the group buffer's nodes (placeholders or
    attributes the caller owns)."""
    groups: dict[object, dict[int, fx.Node]] = {}
    sizes: dict[object, int] = {}
    rows: dict[fx.Node, tuple[int, int]] = {}
    for node in _gemms(graph):
        call = GemmCall.of(node)
        codes = call.weight_operand().codes
        where = layout(codes) if isinstance(codes, fx.Node) else None
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
                report.notes.append(f"not fused into one GEMM ({reason}): {names}")
            continue
        _fuse(graph, nodes, [rows[n] for n in nodes], buffers(key), order)
        fused += 1
        if report is not None:
            report.count("gemm_groups_fused")
            report.count("gemm_launches_saved", len(nodes) - 1)
            names = ", ".join(module_path(n) or "<root>" for n in nodes)
            report.notes.append(f"one GEMM for {names}")
    return fused


def _refuse(nodes: list[fx.Node | None]) -> str:
    """Why these GEMMs (in buffer order) cannot run as one, or ''."""
    if any(n is None for n in nodes):
        return "not every member of the group is a GEMM of this graph"
    calls = [GemmCall.of(n) for n in nodes]
    if len({_x_key(n, c) for n, c in zip(nodes, calls)}) != 1:
        return "the members read different X operands"
    if any(c.bias is not None for c in calls):
        return "a member has a bias"
    if any(c.w_ongrid is not None for c in calls):
        return "a member reads an on-grid weight copy"
    return ""


def _fuse(graph, nodes, spans, buffer, order) -> None:
    first = min(nodes, key=order.__getitem__)
    codes, scales = buffer
    call = GemmCall.of(nodes[0])
    call = call._replace(w=QuantizedWeight(codes, scales, call.weight_operand().global_decode))
    with graph.inserting_before(first):
        fused = graph.call_function(call.overload(), call.args())
    # the members' output, N_total wide (not propagated: a bound graph's store inputs carry
    # values of the binding's fake mode, its other nodes the lowering's)
    fused.meta.update(nodes[0].meta)
    v = nodes[0].meta["val"]
    with v.fake_mode if hasattr(v, "fake_mode") else contextlib.nullcontext():
        val = v.new_empty((*v.shape[:-1], sum(n for _, n in spans)))
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
    reads = [GemmCall.of(n).weight_operand().scales for n in nodes]  # their scale-byte views
    erase_dead(graph, [*nodes, *(r for r in reads if isinstance(r, fx.Node))])
