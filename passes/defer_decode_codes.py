"""Pass, defer decode codes: in an inference graph (the rollout engine's, after its group GEMMs are
fused), a producer that emits its GEMM operand (no X^T) - an RMSNorm (`rms_norm_quantize`,
`add_rms_norm_quantize`), a dense SwiGLU (`silu_mul_quantize`) or the experts' SwiGLU
(`silu_mul_halves_quantize`, on the halves of the gate/up output) - whose on-grid rows and
global decodes only NVFP4 GEMMs on its own output read (`nvfp4_linear_quantized`: q/k/v,
gate/up, down; `nvfp4_grouped_mm_quantized`: the experts' gate/up on the normed rows gathered
by expert order, the experts' down) becomes `rms_norm_quantize_parts` /
`silu_mul_quantize_parts`, and those GEMMs `nvfp4_linear_parts` / `nvfp4_grouped_mm_parts`
reading the producer's values and row (chunk) maxima too. At few rows (a decode GEMM,
`codegen/nvfp4/norm_parts.codes_deferred`) the producer then runs its first launch alone and the
decode GEMM quantizes y in its prologue (the experts' GEMM: each gathered row from its source
row): no `row_codes` launch; elsewhere the same launches as before. The experts' SwiGLU
and its down GEMM decide on the rows per expert that GEMM's decode kernel sees (both ops'
`groups` = E), not on the SwiGLU's M = tokens x top-k rows. The producer's values keep
their other readers (the router reads the normed rows). The same bits everywhere
(`norm_parts.py`, `silu_mul_parts.py`, `grouped_parts.py`; tests/passes/test_defer_decode_codes.py,
tests/rollout/test_defer_decode_codes_engine.py, tests/rollout/test_defer_moe_codes_engine.py).
The new ops have no backward: the caller runs this on graphs that track no gradient, and the
pass refuses an operand read by anything else. Returns the number of producers rewritten;
refusals are notes of `report`."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen.nvfp4.gemm_call import GemmCall, is_gemm
from .graph_utils import erase_dead, fake, insert_call
from .report import LoweringReport


def _ops():
    return torch.ops.fp4_compile


def _outputs(node: fx.Node) -> dict[int, list[fx.Node]] | None:
    """Output index -> its getitem nodes, or None if read otherwise."""
    out: dict[int, list[fx.Node]] = {}
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            return None
        out.setdefault(user.args[1], []).append(user)
    return out


# ops that pass a tensor's values on unchanged (shape only): a grouped GEMM's x may be y so
_SAME_VALUES = {"view", "reshape", "contiguous"}
_ATEN_VIEWS = (torch.ops.aten.view.default, torch.ops.aten.reshape.default)


def _values_of(node, y_nodes) -> bool:
    """Whether `node` holds the values of one of `y_nodes` (through views, a same-dtype `.to`)."""
    while node not in y_nodes:
        if not isinstance(node, fx.Node) or not node.args:
            return False
        same = node.op == "call_method" and node.target in _SAME_VALUES
        same = same or (node.op == "call_function" and node.target in _ATEN_VIEWS)
        if node.op == "call_method" and node.target == "to" and len(node.args) == 2:
            src, val = fake(node.args[0]), fake(node)
            same = src is not None and val is not None and node.args[1] == src.dtype == val.dtype
        if not same:
            return False
        node = node.args[0]
    return True


def _transposed(norm: fx.Node) -> bool:
    """Whether the producer emits X^T's operand (silu_mul_halves_quantize never does)."""
    if norm.target is _ops().silu_mul_halves_quantize.default:
        return False
    return norm.args[-1] is not False


def _reads_operand(gemm: fx.Node, outs: dict) -> bool:
    """Whether GEMM node `gemm` reads exactly the producer's y (as x) and its operand."""
    call = GemmCall.of(gemm)
    if call.x_amax is not None:
        return False
    if call.is_grouped():  # x: y through views
        x, ops = fake(call.x), call.x_operands[:2]
        y = fake(outs[0][0]) if outs.get(0) else None
        if x is None or y is None or x.dtype != y.dtype or not _values_of(call.x, outs[0]):
            return False
        return all(a in outs.get(i, ()) for a, i in zip(ops, (1, 2)))
    got = zip((call.x, *call.x_operands), (0, 1, 2, 3, 4))
    return all(a in outs.get(i, ()) for a, i in got)


def _refusal(norm: fx.Node, outs: dict | None) -> tuple[str | None, list[fx.Node]]:
    """(why the norm stays as it is, or None; its consumer GEMM nodes)."""
    if outs is None:
        return "the producer's outputs are read other than by index", []
    if _transposed(norm):
        return "the producer emits X^T's operand (a graph with a backward)", []
    x = fake(norm.args[0])
    if x is None or x.requires_grad:
        return "no example value, or the producer's input requires grad", []
    readers = {u for i in (1, 2, 3, 4) for g in outs.get(i, ()) for u in g.users}
    if not readers:
        return "no GEMM reads the producer's operand", []
    for gemm in readers:
        if not is_gemm(gemm, "nvfp4_linear_quantized", "nvfp4_grouped_mm_quantized"):
            return "the operand is read by another op than the NVFP4 GEMMs", []
        if not _reads_operand(gemm, outs):
            return "a GEMM reads the operand with another x or another X^T", []
    return None, sorted(readers, key=list(norm.graph.nodes).index)


def _producer(graph: fx.Graph, node: fx.Node, groups: int):
    """(the parts op, its arguments) replacing producer `node`."""
    ops = _ops()
    if node.target is ops.rms_norm_quantize.default:
        x, weight, eps, recipe, _ = node.args
        return ops.rms_norm_quantize_parts.default, (x, None, weight, eps, recipe)
    if node.target is ops.add_rms_norm_quantize.default:
        x, residual, weight, eps, recipe, _ = node.args
        return ops.rms_norm_quantize_parts.default, (x, residual, weight, eps, recipe)
    if node.target is ops.silu_mul_halves_quantize.default:  # silu_mul on x's halves, bitwise
        x, row_mask, recipe = node.args
        c = fake(x).shape[-1] // 2
        a, b = (
            insert_call(graph, torch.ops.aten.slice.Tensor, (x, -1, lo, hi), before=node, like=node)
            for lo, hi in ((0, c), (c, 2 * c))
        )
        return ops.silu_mul_quantize_parts.default, (a, b, row_mask, recipe, groups)
    a, b, row_mask, recipe, _ = node.args  # silu_mul_quantize
    return ops.silu_mul_quantize_parts.default, (a, b, row_mask, recipe, groups)


def _groups(norm: fx.Node, gemms: list[fx.Node]) -> int:
    """The weights the producer's rows split over, for both sides' `codes_deferred`: a SwiGLU
    read only by grouped GEMMs over E experts each on its rows as they are (no x_index: the
    experts' down GEMM, whose decode kernel sees cdiv(M, E) rows per expert): E; else 1."""
    if norm.target in (_ops().rms_norm_quantize.default, _ops().add_rms_norm_quantize.default):
        return 1
    calls = [GemmCall.of(g) for g in gemms]
    if not all(c.is_grouped() and c.x_index is None for c in calls):
        return 1
    codes = [fake(c.weight_operand().codes) for c in calls]
    experts = {int(w.shape[0]) if w is not None else 0 for w in codes}
    return experts.pop() if len(experts) == 1 and 0 not in experts else 1


def _consumer(gemm: fx.Node, y, a, gd, parts, groups: int):
    """(the parts GEMM op, its arguments) replacing GEMM `gemm`."""
    call = GemmCall.of(gemm)
    w = call.weight_operand()
    if call.is_grouped():
        args = (y, a, gd, parts, *w, call.w_ongrid, call.offsets, call.x_index, groups)
        return _ops().nvfp4_grouped_mm_parts.default, args
    args = (y, a, gd, parts, w.codes, w.scales, w.global_decode, call.w_ongrid, call.bias)
    return _ops().nvfp4_linear_parts.default, args


def _rewrite(graph: fx.Graph, norm: fx.Node, outs: dict, gemms: list[fx.Node]) -> None:
    groups = _groups(norm, gemms)
    target, args = _producer(graph, norm, groups)
    new = insert_call(graph, target, args, before=norm, like=norm)
    got = {}
    for i in range(len(new.meta["val"])):
        with graph.inserting_after(new):
            got[i] = graph.call_function(operator.getitem, (new, i))
        got[i].meta["val"] = new.meta["val"][i]
    y, a, gd, parts = (got[i] for i in range(4))
    h = got.get(4)
    views = []  # a grouped GEMM's x: views of y, dead once the GEMM reads y itself
    for gemm in gemms:
        x = GemmCall.of(gemm).x
        while isinstance(x, fx.Node) and x not in outs.get(0, ()):
            views.append(x)
            x = x.args[0]
    for gemm in gemms:
        target, args = _consumer(gemm, y, a, gd, parts, groups)
        with graph.inserting_before(gemm):  # the same output as the GEMM's: its meta
            lin = graph.call_function(target, args)
        lin.meta.update(gemm.meta)  # (its weights' fakes may be of the store's own fake mode)
        gemm.replace_all_uses_with(lin)
        graph.erase_node(gemm)
    for i, nodes in outs.items():  # y (0) and h (5) keep their other readers
        for node in nodes:
            if i in (0, 5):
                node.replace_all_uses_with(y if i == 0 else h)
    erase_dead(graph, [*(g for nodes in outs.values() for g in nodes), norm])
    erase_dead(graph, list(got.values()))
    erase_dead(graph, views)


def defer_decode_codes(graph: fx.Graph, report: LoweringReport | None = None) -> int:
    ops = _ops()
    norms = (
        ops.rms_norm_quantize.default,
        ops.add_rms_norm_quantize.default,
        ops.silu_mul_quantize.default,
        ops.silu_mul_halves_quantize.default,
    )
    refused: dict[str, int] = {}
    done = 0
    for norm in list(graph.nodes):
        if norm.op != "call_function" or norm.target not in norms:
            continue
        outs = _outputs(norm)
        why, gemms = _refusal(norm, outs)
        if why is not None:
            refused[why] = refused.get(why, 0) + 1
            continue
        _rewrite(graph, norm, outs, gemms)
        done += 1
    if report is not None:
        if done:
            report.count("decode_codes_deferred", done)
        for why, n in refused.items():
            report.notes.append(f"codes not deferred to the decode GEMM at {n} site(s): {why}")
    return done
