"""Pass, lower SwiGLUs: silu(a) * b (a gated MLP's activation, dense or MoE experts) becomes
`fp4_compile::silu_mul`, whose forward and backward run eager ATen kernels on every engine.
Left to Inductor, the SwiGLU's backward rounded differently from eager on the H200
(codegen/silu_mul.py says where it was measured). The silu node is absorbed only when the
multiply is its one user; a silu used elsewhere is left, and so is its multiply."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, insert_call
from .patterns import is_mul, is_silu
from .report import LoweringReport


def _silu_mul_operands(node):
    """(a, b) when the multiply is silu(a) * b (either order) on equal shapes and dtypes."""
    if node.op != "call_function" and node.op != "call_method":
        return None
    if len(node.args) != 2 or node.kwargs:
        return None
    for s, b in (node.args, node.args[::-1]):
        if not is_silu(s) or len(s.users) != 1 or not isinstance(b, fx.Node):
            continue
        a = s.args[0] if s.args else s.kwargs.get("input")
        fa, fb, fo = fake(a), fake(b), fake(node)
        if fa is None or fb is None or fo is None:
            continue
        if fa.dtype != fb.dtype or fa.shape != fb.shape or fo.shape != fa.shape:
            continue
        if not fa.dtype.is_floating_point or fo.dtype != fa.dtype:
            continue
        return a, b
    return None


def lower_silu_muls(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if not is_mul(node):
            continue
        operands = _silu_mul_operands(node)
        if operands is None:
            continue
        silu = next(s for s in node.args if isinstance(s, fx.Node) and is_silu(s))
        new = insert_call(
            graph, torch.ops.fp4_compile.silu_mul.default, operands, before=node, like=node
        )
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        graph.erase_node(silu)
        report.count("silu_mul")
    gm.recompile()
