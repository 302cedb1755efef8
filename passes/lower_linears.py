"""Pass, lower linears: every `linear` the select pass marked NVFP4 becomes
`fp4_compile` nvfp4_linear (bias folded into the epilogue), its weight quantized by ONE
quantize-weight node shared by every use of that weight in the graph (once per forward, i.e.
once per weight version within a step); every BF16-marked linear becomes the batch-invariant BF16
linear. The master weight stays an input of the op so autograd returns its gradient
(straight-through). With `recipe.shared_weight_scale`, the weights of a fused group (q/k/v,
gate/up: `fp4_compile/weight_policy.py`) are quantized together under the group's one global scale."""

from __future__ import annotations

import torch.fx as fx

from ..recipe import NVFP4Recipe
from ..weight_policy import shared_scale_groups
from .patterns import is_linear, scalar_arg
from .report import LoweringReport
from .targets import (
    call_site,
    emit_bf16_linear,
    emit_nvfp4_linear,
    emit_quantize_weight,
    emit_quantize_weight_group,
)


def quantized_weight_node(
    graph: fx.Graph, weight: fx.Node, cache: dict, recipe: NVFP4Recipe, groups: dict | None = None
):
    """One set of quantize nodes per weight, inserted right after the weight is defined (after
    the last member of its shared-scale group, `groups`: weight node -> the group's nodes)."""
    if weight not in cache:
        members = (groups or {}).get(weight)
        if members is None:
            cache[weight] = emit_quantize_weight(graph, weight, recipe)
        else:
            cache.update(zip(members, emit_quantize_weight_group(graph, members, recipe)))
    return cache[weight]


def _weight_groups(graph: fx.Graph, recipe: NVFP4Recipe) -> dict[fx.Node, list[fx.Node]]:
    """weight node -> the weight nodes of its shared-scale group, over the NVFP4 linears."""
    weight_of: dict[str, fx.Node] = {}
    for node in graph.nodes:
        decision = node.meta.get("minite_gemm")
        if decision and decision.kind == "linear" and decision.precision == "nvfp4":
            if is_linear(node):
                weight_of.setdefault(decision.module, node.args[1])
    out: dict[fx.Node, list[fx.Node]] = {}
    for name, paths in shared_scale_groups(weight_of, recipe).items():
        members = list(dict.fromkeys(weight_of[p] for p in paths))
        if any(m in out for m in members):
            raise ValueError(
                f"a weight of {name} also belongs to another fused group (a weight shared "
                "between modules); one global scale per group cannot hold: use a recipe with "
                "shared_weight_scale=False"
            )
        if len(members) > 1:
            out.update((m, members) for m in members)
    return out


def lower_linears(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    cache = gm.meta.setdefault("minite_weight_q", {})
    groups = _weight_groups(graph, recipe)
    if groups:
        report.count("shared weight scale groups", len({id(m) for m in groups.values()}))
    for node in list(graph.nodes):
        decision = node.meta.get("minite_gemm")
        if decision is None or decision.kind != "linear" or not is_linear(node):
            continue
        x, weight = node.args[0], node.args[1]
        bias = scalar_arg(node, 2, "bias")
        if decision.precision == "nvfp4":
            wq = quantized_weight_node(graph, weight, cache, recipe, groups)
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
