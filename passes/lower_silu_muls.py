"""Pass, lower SwiGLUs: silu(a) * b (a gated MLP's activation, dense or MoE experts) becomes
`fp4_compile::silu_mul`, one opaque op that the compiled and the eager graph both call (on CUDA
its Triton passes, ATen's operations; elsewhere the ATen ops). Left to Inductor, the SwiGLU's
backward rounded differently from eager on the H200 (codegen/invariant/silu_mul.py says where it was
measured). The silu node is absorbed only when the multiply is its one user and nothing between
them writes to a in place; otherwise the silu and its multiply are left as they are."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, replace_with_call, written_between
from .patterns import is_mul, is_silu
from .report import LoweringReport


def _silu_mul_operands(node):
    """(silu node, a, b) when the multiply is silu(a) * b (either order) on equal shapes and
    dtypes, else None."""
    if len(node.args) != 2 or node.kwargs:
        return None
    for s, b in (node.args, node.args[::-1]):
        if not is_silu(s) or len(s.users) != 1 or not isinstance(b, fx.Node) or b is s:
            continue
        a = s.args[0] if s.args else s.kwargs.get("input")
        fa, fb, fo = fake(a), fake(b), fake(node)
        if fa is None or fb is None or fo is None:
            continue
        if fa.dtype != fb.dtype or fa.shape != fb.shape or fo.shape != fa.shape:
            continue
        if not fa.dtype.is_floating_point or fo.dtype != fa.dtype:
            continue
        if written_between(node.graph, s, node, (a,)):  # the op reads a at the multiply
            return None
        return s, a, b
    return None


def lower_silu_muls(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if not is_mul(node):
            continue
        matched = _silu_mul_operands(node)
        if matched is None:
            continue
        silu, a, b = matched
        replace_with_call(graph, node, torch.ops.fp4_compile.silu_mul.default, (a, b))
        graph.erase_node(silu)
        report.count("silu_mul")
    gm.recompile()
