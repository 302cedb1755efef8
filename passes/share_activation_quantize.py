"""Pass, share activation quantize: NVFP4 linears that read the same tensor X with the same
quantization (one recipe, one static amax or none) get X quantized ONCE, by one
`fp4_compile::quantize_activation` node, and each becomes `nvfp4_linear_quantized` reading its
operands (q/k/v of one normed X, gate/up of a dense MLP). In a graph that needs the weights'
gradients and quantizes wgrad's X^T (recipe.wgrad NVFP4), the same node also quantizes X^T once,
and every reader's backward reads it: X's quantization (forward) and X^T's (backward) are paid
once per distinct X instead of once per GEMM. The same bits as the unshared graph: the same
quantizer on the same X, the same GEMMs (tests/passes/test_share_activation_quantize.py).
`explain` counts the shared nodes (`activation_quantize_shared`) and the quantizations they
saved (`activation_quantize_saved`), and notes which linears share one."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen.nvfp4.gemm_call import ActivationOperands, GemmCall, encode_recipe, is_gemm
from ..recipe import NVFP4Recipe
from .graph_utils import fake, insert_call, module_path
from .report import LoweringReport
from .targets import replace_gemm


def _ops():
    return torch.ops.fp4_compile


def needs_transposed(linears: list[fx.Node], recipe: NVFP4Recipe) -> bool:
    """Whether the readers' backward quantizes X^T: an NVFP4 wgrad in a graph that tracks the
    gradient of one of their weights (an inference graph, e.g. the exported rollout, does not)."""
    if recipe.wgrad == "bf16":
        return False
    weights = (fake(GemmCall.of(n).weight) for n in linears)
    return any(w is not None and w.requires_grad for w in weights) and torch.is_grad_enabled()


def shared_readers(graph: fx.Graph) -> list[list[fx.Node]]:
    """The groups (in graph order, two or more each) of nvfp4_linear nodes with the same X,
    static amax and recipe."""
    groups: dict[tuple, list[fx.Node]] = {}
    for node in graph.nodes:
        if is_gemm(node, "nvfp4_linear"):
            call = GemmCall.of(node)
            key = (call.x, call.x_amax, encode_recipe(call.recipe))
            groups.setdefault(key, []).append(node)
    return [g for g in groups.values() if len(g) > 1]


def emit_quantize_activation(
    graph: fx.Graph, readers: list[fx.Node], transposed: bool, recipe: NVFP4Recipe
) -> ActivationOperands:
    """detach(X) -> quantize_activation -> its four outputs, before the first reader."""
    first = readers[0]
    call = GemmCall.of(first)
    det = insert_call(graph, torch.ops.aten.detach.default, (call.x,), before=first, like=first)
    q = insert_call(
        graph,
        _ops().quantize_activation.default,
        (det, encode_recipe(recipe), call.x_amax, bool(transposed)),
        before=first,
        like=first,
    )
    return ActivationOperands(
        *(insert_call(graph, operator.getitem, (q, i), before=first, like=first) for i in range(4))
    )


def share_activation_quantize(
    gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport
) -> None:
    graph = gm.graph
    for readers in shared_readers(graph):
        transposed = needs_transposed(readers, recipe)
        operands = emit_quantize_activation(graph, readers, transposed, recipe)
        for node in readers:
            replace_gemm(graph, node, GemmCall.of(node)._replace(x_operands=operands))
        report.count("activation_quantize_shared")
        report.count("activation_quantize_saved", len(readers) - 1)
        names = ", ".join(module_path(n) or "<root>" for n in readers)
        report.notes.append(f"one activation quantize shared by {names}")
    gm.recompile()
