"""Pass, defer decode codes: in an inference graph (the rollout engine's, after its group GEMMs are
fused), a producer that emits its GEMM operand (no X^T) - an RMSNorm (`rms_norm_quantize`,
`add_rms_norm_quantize`) or a dense SwiGLU (`silu_mul_quantize`) - whose on-grid rows and global
decodes only NVFP4 linears on its own output read (`nvfp4_linear_quantized`: q/k/v, gate/up,
down) becomes `rms_norm_quantize_parts` / `silu_mul_quantize_parts`, and those linears
`nvfp4_linear_parts` reading the producer's row (chunk) maxima too. At few rows (a decode GEMM,
`codegen/nvfp4/norm_parts.codes_deferred`) the producer then runs its first launch alone and the
decode GEMM quantizes y in its prologue: no `row_codes` launch; elsewhere the same launches as
before. The same bits everywhere (`norm_parts.py`, `silu_mul_parts.py`;
tests/passes/test_defer_decode_codes.py, tests/rollout/test_defer_decode_codes_engine.py). The
new ops have no backward: the caller runs this on graphs that track no gradient, and the pass
refuses an operand read by anything else. Returns the number of producers rewritten; refusals
are notes of `report`."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen.nvfp4.gemm_call import GemmCall
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


def _refusal(norm: fx.Node, outs: dict | None) -> tuple[str | None, list[fx.Node]]:
    """(why the norm stays as it is, or None; its consumer GEMM nodes)."""
    if outs is None:
        return "the producer's outputs are read other than by index", []
    if norm.args[-1] is not False:
        return "the producer emits X^T's operand (a graph with a backward)", []
    x = fake(norm.args[0])
    if x is None or x.requires_grad:
        return "no example value, or the producer's input requires grad", []
    readers = {u for i in (1, 2, 3, 4) for g in outs.get(i, ()) for u in g.users}
    if not readers:
        return "no GEMM reads the producer's operand", []
    linear = _ops().nvfp4_linear_quantized.default
    for gemm in readers:
        if gemm.op != "call_function" or gemm.target is not linear:
            return "the operand is read by another op than nvfp4_linear_quantized", []
        call = GemmCall.of(gemm)
        ops = call.x_operands
        got = zip((call.x, *ops), (0, 1, 2, 3, 4))
        if any(a not in outs.get(i, ()) for a, i in got) or call.x_amax is not None:
            return "a GEMM reads the operand with another x or another X^T", []
    return None, sorted(readers, key=list(norm.graph.nodes).index)


def _producer(node: fx.Node):
    """(the parts op, its arguments) replacing producer `node`."""
    ops = _ops()
    if node.target is ops.rms_norm_quantize.default:
        x, weight, eps, recipe, _ = node.args
        return ops.rms_norm_quantize_parts.default, (x, None, weight, eps, recipe)
    if node.target is ops.add_rms_norm_quantize.default:
        x, residual, weight, eps, recipe, _ = node.args
        return ops.rms_norm_quantize_parts.default, (x, residual, weight, eps, recipe)
    a, b, row_mask, recipe, _ = node.args  # silu_mul_quantize
    return ops.silu_mul_quantize_parts.default, (a, b, row_mask, recipe)


def _rewrite(graph: fx.Graph, norm: fx.Node, outs: dict, gemms: list[fx.Node]) -> None:
    target, args = _producer(norm)
    new = insert_call(graph, target, args, before=norm, like=norm)
    got = {}
    for i in range(len(new.meta["val"])):
        with graph.inserting_after(new):
            got[i] = graph.call_function(operator.getitem, (new, i))
        got[i].meta["val"] = new.meta["val"][i]
    y, a, gd, parts = (got[i] for i in range(4))
    h = got.get(4)
    for gemm in gemms:
        call = GemmCall.of(gemm)
        w = call.weight_operand()
        args = (y, a, gd, parts, w.codes, w.scales, w.global_decode, call.w_ongrid, call.bias)
        with graph.inserting_before(gemm):  # the same output as the GEMM's: its meta
            lin = graph.call_function(_ops().nvfp4_linear_parts.default, args)
        lin.meta.update(gemm.meta)  # (its weights' fakes may be of the store's own fake mode)
        gemm.replace_all_uses_with(lin)
        graph.erase_node(gemm)
    for i, nodes in outs.items():  # y (0) and h (5) keep their other readers
        for node in nodes:
            if i in (0, 5):
                node.replace_all_uses_with(y if i == 0 else h)
    erase_dead(graph, [*(g for nodes in outs.values() for g in nodes), norm])
    erase_dead(graph, list(got.values()))


def defer_decode_codes(graph: fx.Graph, report: LoweringReport | None = None) -> int:
    ops = _ops()
    norms = (
        ops.rms_norm_quantize.default,
        ops.add_rms_norm_quantize.default,
        ops.silu_mul_quantize.default,
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
