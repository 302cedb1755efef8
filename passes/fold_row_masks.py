"""Pass, fold row masks: `y = x.masked_fill(mask, 0)` zeroing whole rows ([S, 1] bool mask) whose
every reader is a row-local op of ours takes the mask as that op's `row_mask` instead, and the
masked copy of x is not made:
- `moe_combine(y, w, idx, k)` -> `moe_combine(x, w, idx, k, row_mask=mask)`;
- `silu_mul(a, b)` with a and b the last-dim halves of y (`y.chunk(2, dim=-1)`, the gated
  experts' SwiGLU) -> the same halves of x, `silu_mul(a, b, row_mask=mask)`.
Each op reads a masked row as zeros and gives it a +0.0 gradient (masked_fill's backward): the
same bits forward and backward as the unfolded graph (`tests/codegen/moe/test_row_masks.py`).
transformers 5.17's grouped experts apply their expert-parallel sentinel mask to both expert
GEMMs' outputs on every call (`proj_out.masked_fill(sentinel_mask, 0.0)`, an all-false mask
without expert parallelism): two full passes over [T * k, 2I] and [T * k, H] forward and two
backward per MoE layer, which this removes. Anything else reading y, an in-place fill, or a
write to x or the mask before the op reads them: left as it is."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import fake, written_args, written_between
from .patterns import is_last_dim_halves, is_masked_fill, row_zero_mask
from .report import LoweringReport


def _row_mask(node: fx.Node):
    """The [S, 1] bool mask when `node` is a functional x.masked_fill(mask, 0) zeroing whole
    rows of a 2-D x, else None."""
    if not is_masked_fill(node) or written_args(node) or not node.args:
        return None
    fx_ = fake(node.args[0])
    if fx_ is None or fx_.dim() != 2:
        return None
    return row_zero_mask(node, fx_.shape[0])


def _readers(node: fx.Node):
    """[(kind, op node, split node or None)] for every reader of the masked tensor, or None when
    one of them cannot take a row mask."""
    ops = torch.ops.fp4_compile
    found = []
    for user in node.users:
        if user.op == "call_function" and user.target is ops.moe_combine.default:
            if len(user.args) != 4 or user.kwargs or user.args[0] is not node:
                return None
            found.append(("combine", user, None))
        elif is_last_dim_halves(user, node):
            for piece in user.users:
                for op in piece.users:
                    if not (op.op == "call_function" and op.target is ops.silu_mul.default):
                        return None
                    if len(op.args) != 2 or op.kwargs:
                        return None
                    a, b = op.args
                    if not all(p.args[0] is user for p in (a, b)) or a is b:
                        return None  # both halves of this y, each once
                    if ("silu", op, user) not in found:
                        found.append(("silu", op, user))
        else:
            return None
    return found or None


def fold_row_masks(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        mask = _row_mask(node)
        if mask is None:
            continue
        readers = _readers(node)
        if readers is None:
            continue
        x = node.args[0]
        if any(written_between(graph, node, op, (x, mask)) for _, op, _ in readers):
            continue  # the op would read x or the mask after a write the fill did not see
        for kind, op, split in readers:
            if kind == "combine":
                op.args = (x, *op.args[1:], mask)
            else:
                split.args = (x, *split.args[1:])
                op.args = (*op.args, mask)
        graph.erase_node(node)
        report.count("row_mask_folded")
    gm.recompile()
