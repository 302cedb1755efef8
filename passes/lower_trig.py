"""Pass, lower trigonometric functions: out-of-place cos / sin on floating tensors (the rotary
embedding's cos and sin) become `fp4_compile::cos` / `fp4_compile::sin`, opaque ops with ATen's
elementwise kernels, so the learner, the rollout graphs and an engine that computes the rotary
outside the graph (the vLLM plugin's model class) get the same bits. Left to Inductor, CPU cos
rounds about 30% of FP32 values differently from ATen (codegen/invariant/trig.py)."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, replace_with_call
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten

# method name -> ((its torch function, its ATen overload), the op that replaces them)
_TARGETS = {
    "cos": ((torch.cos, aten.cos.default), torch.ops.fp4_compile.cos.default),
    "sin": ((torch.sin, aten.sin.default), torch.ops.fp4_compile.sin.default),
}


def lower_trig(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        for name, (functions, op) in _TARGETS.items():
            if not is_op(node, functions=functions, methods=(name,)):
                continue
            if len(node.args) != 1 or node.kwargs:  # out= and other forms stay
                continue
            x = fake(node.args[0])
            if x is None or not x.dtype.is_floating_point:
                continue
            replace_with_call(graph, node, op, (node.args[0],))
            report.count(name)
            break
    gm.recompile()
