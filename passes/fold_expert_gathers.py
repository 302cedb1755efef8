"""Pass, fold expert gathers: `nvfp4_grouped_mm(gather_rows(h, idx), ...)`, where the gathered
copy has no other reader (the experts' `hidden_states[perm // top_k]`), becomes
`nvfp4_grouped_mm(h, ..., x_index=idx)`. The op then quantizes h once per token (1x16 blocks
are row-local, so a gathered row's quantization is its source row's; a per-tensor amax is taken
over the gathered rows only) and gathers the on-grid rows in the GEMM's operand load; its
backward reads X^T through the index and returns h's gradient with `gather_rows`' own
position-ordered sums. The same bits as the unfolded graph, without the top_k-times gathered
copy of h, its quantize and its amax (an MoE layer of the learner: 8x the tokens)."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, fake, replace_with_call
from .patterns import is_cast
from .report import LoweringReport

X_INDEX_ARG = 10  # of fp4_compile::nvfp4_grouped_mm, after site


def _sole_reader_chain(x: fx.Node):
    """[x, and the dtype-preserving casts between it and its GEMM] when each has one reader (the
    experts call `.to(weight.dtype)` on their input: a no-op cast in a bf16 model)."""
    chain = [x]
    while is_cast(x) and isinstance(x.args[0], fx.Node):
        src = x.args[0]
        if fake(src) is None or fake(x) is None or fake(src).dtype != fake(x).dtype:
            return None  # a real conversion: the GEMM quantizes the converted values
        chain.append(src)
        x = src
    return chain if all(len(n.users) == 1 for n in chain) else None


def fold_expert_gathers(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    ops = torch.ops.fp4_compile
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not ops.nvfp4_grouped_mm.default:
            continue
        if not isinstance(node.args[0], fx.Node) or len(node.args) > X_INDEX_ARG or node.kwargs:
            continue
        chain = _sole_reader_chain(node.args[0])
        gathered = chain[-1] if chain else None
        if (
            gathered is None
            or gathered.op != "call_function"
            or (gathered.target is not ops.gather_rows.default)
        ):
            continue
        h, idx = gathered.args
        args = (*node.args, *([0] * (X_INDEX_ARG - len(node.args))))  # site defaults to 0
        replace_with_call(graph, node, node.target, (h, *args[1:], idx))
        erase_dead(graph, chain)
        report.count("expert_gather_folded")
    gm.recompile()
