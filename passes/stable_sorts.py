"""Pass, stable sorts: every `sort` / `argsort` becomes its stable form. An unstable sort may
order equal keys differently on every implementation (eager CUDA, Inductor's Triton sort, the
CPU), and transformers' MoE experts sort the (token, expert) pairs by expert id with
`torch.sort(expert_ids)`: the tokens of one expert then reach the grouped GEMMs in an order the
values do not fix, and a weight gradient, a sum over those tokens, changes its bits with the
order (on the H200 the compiled tiny Qwen3-MoE's gradients differed from the same lowered
graph run eagerly in 22 of 25 tensors,
`benchmarks/results/2026-12-03_grad_localize_gpu_30b4k_bf16.md`, the before_stable_sort run).
A stable sort has exactly one answer, so every implementation agrees."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import arg
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten


def _is_sort(node) -> bool:
    return is_op(node, functions=(torch.sort,), methods=("sort",), overloads=(aten.sort,))


def _is_argsort(node) -> bool:
    return is_op(node, functions=(torch.argsort,), methods=("argsort",), overloads=(aten.argsort,))


def _already_stable(node: fx.Node) -> bool:
    # `stable` is keyword-only in every spelling (torch.sort, Tensor.sort, aten.sort.stable)
    return bool(node.kwargs.get("stable", False))


def stable_sorts(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        is_sort = _is_sort(node)
        if not (is_sort or _is_argsort(node)) or _already_stable(node):
            continue
        if isinstance(node.target, torch._ops.OpOverload):
            if node.target._overloadname not in ("default", "stable"):
                raise NotImplementedError(f"stable_sorts: unhandled overload {node.target}")
            # aten.sort.default(self, dim=-1, descending=False) -> aten.sort.stable(self, *,
            # stable, dim, descending); the same for argsort
            dim = arg(node, 1, "dim", -1)
            descending = arg(node, 2, "descending", False)
            packet = aten.sort if is_sort else aten.argsort
            node.target = packet.stable
            node.args = (node.args[0],)
            node.kwargs = {"stable": True, "dim": dim, "descending": descending}
        else:
            # torch.sort(x, dim=-1, descending=False, stable=False) / x.sort(...): same
            # positional order for functions and methods (self first)
            dim = arg(node, 1, "dim", -1)
            descending = arg(node, 2, "descending", False)
            node.args = (node.args[0],)
            node.kwargs = {"dim": dim, "descending": descending, "stable": True}
        report.count("stable_sort")
    gm.recompile()
