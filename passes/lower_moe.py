"""Pass, lower MoE experts: transformers' fused experts (`grouped_mm` implementation, the default
in transformers 5: `transformers::grouped_mm_fallback` on CPU, `torch._grouped_mm` on CUDA, with
weights passed as [E, K, N] transposes of the [E, N, K] parameters `gate_up_proj` / `down_proj`)
become `fp4_compile` nvfp4_grouped_mm over the untransposed parameters, quantized once per
forward with 16x16 tiles and one global scale per expert; BF16-marked ones the invariant BF16
grouped GEMM. Tokens arrive sorted by expert with int32 group-end offsets."""

from __future__ import annotations

import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, fake
from .lower_linears import quantized_weight_node
from .patterns import is_cast, scalar_arg
from .report import LoweringReport
from .targets import call_site, emit_bf16_grouped, emit_nvfp4_grouped


def _is_last_two_transpose(node) -> bool:
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method" and node.target in ("transpose", "mT"):
        dims = tuple(node.args[1:3])
        return node.target == "mT" or dims in ((-2, -1), (-1, -2), (1, 2), (2, 1))
    name = getattr(node.target, "__name__", "")
    if node.op == "call_function" and name in ("transpose", "transpose.int"):
        return tuple(node.args[1:3]) in ((-2, -1), (-1, -2), (1, 2), (2, 1))
    return False


def _untransposed_weight(w_t: fx.Node):
    """Walk [E, K, N] back through casts to the transpose of the [E, N, K] parameter."""
    chain = []
    node = w_t
    while is_cast(node):
        chain.append(node)
        node = node.args[0]
    if not _is_last_two_transpose(node):
        return None, []
    chain.append(node)
    return node.args[0], chain


def lower_moe(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    cache = gm.meta.setdefault("minite_weight_q", {})
    for node in list(graph.nodes):
        decision = node.meta.get("minite_gemm")
        if decision is None or decision.kind != "grouped_mm":
            continue
        x, w_t = node.args[0], node.args[1]
        offsets = scalar_arg(node, 2, "offs")
        weight, chain = _untransposed_weight(w_t)
        if weight is None or offsets is None or fake(weight) is None:
            decision.reason = (
                decision.reason + "; " if decision.reason else ""
            ) + "weights not a transposed [E,N,K] parameter"
            continue
        if decision.precision == "nvfp4":
            wq = quantized_weight_node(graph, weight, cache, recipe)
            new = emit_nvfp4_grouped(
                graph, node, x, weight, wq, offsets, recipe, call_site(graph, decision)
            )
            decision.lowered_to = "fp4_compile.nvfp4_grouped_mm"
        else:
            new = emit_bf16_grouped(graph, node, x, weight, offsets)
            decision.lowered_to = "fp4_compile.grouped_mm (bf16, invariant)"
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        erase_dead(graph, chain)
        report.count(decision.lowered_to)
    gm.recompile()
