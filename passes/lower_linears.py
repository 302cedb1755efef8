"""Pass, lower linears: every `linear` the select pass marked NVFP4 becomes
`fp4_compile` nvfp4_linear (bias folded into the epilogue), its weight quantized by ONE
quantize-weight node shared by every use of that weight in the graph (once per forward, i.e.
once per weight version within a step); every BF16-marked linear becomes the batch-invariant BF16
linear. The master weight stays an input of the op so autograd returns its gradient
(straight-through)."""

from __future__ import annotations

import torch.fx as fx

from ..recipe import NVFP4Recipe
from .patterns import is_linear, scalar_arg
from .report import LoweringReport
from .targets import call_site, emit_bf16_linear, emit_nvfp4_linear, emit_quantize_weight


def quantized_weight_node(graph: fx.Graph, weight: fx.Node, cache: dict, recipe: NVFP4Recipe):
    """One set of quantize nodes per weight, inserted right after the weight is defined."""
    if weight not in cache:
        cache[weight] = emit_quantize_weight(graph, weight, recipe)
    return cache[weight]


def lower_linears(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    cache = gm.meta.setdefault("minite_weight_q", {})
    for node in list(graph.nodes):
        decision = node.meta.get("minite_gemm")
        if decision is None or decision.kind != "linear" or not is_linear(node):
            continue
        x, weight = node.args[0], node.args[1]
        bias = scalar_arg(node, 2, "bias")
        if decision.precision == "nvfp4":
            wq = quantized_weight_node(graph, weight, cache, recipe)
            new = emit_nvfp4_linear(
                graph, node, x, weight, wq, bias, recipe, call_site(graph, decision)
            )
            decision.lowered_to = "fp4_compile.nvfp4_linear"
        else:
            new = emit_bf16_linear(graph, node, x, weight, bias)
            decision.lowered_to = "fp4_compile.linear (bf16, invariant)"
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        report.count(decision.lowered_to)
    gm.recompile()
