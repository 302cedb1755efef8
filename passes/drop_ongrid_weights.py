"""Pass, drop on-grid weights (backend option `save_ongrid_weights=False`; not in PIPELINE, run
after it): undo the lowering's once-per-step weight dequantize (`quantize_with_ongrid`).
Every NVFP4 GEMM gets w_ongrid=None back (its forward and its dgrad then dequantize for
themselves, so autograd keeps no BF16-size copy of the weight from the forward to the backward),
the weight quantize nodes return to plain `quantize` (packed again where they were on-grid
only). The bits do not change."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..codegen.nvfp4.op_args import QuantizeArg, QuantizeOut
from .skip_unread_packed_weights import is_ongrid_only, set_packed


def drop_ongrid_weights(gm: fx.GraphModule) -> int:
    """Drop every on-grid weight copy of the lowered graph; returns how many went."""
    ops = torch.ops.fp4_compile
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not ops.quantize_with_ongrid.default:
            continue
        for get in [u for u in node.users if u.args[1] == QuantizeOut.ONGRID]:
            for user in list(get.users):
                user.args = tuple(None if a is get else a for a in user.args)
            gm.graph.erase_node(get)
            dropped += 1
        if is_ongrid_only(node):  # quantized on-grid only: packed again
            set_packed(node, True)
        node.target = ops.quantize.default
        node.meta["val"] = node.meta["val"][: QuantizeOut.ONGRID]
        node.args = node.args[: QuantizeArg.PACKED]
    if dropped:
        gm.graph.lint()
        gm.recompile()
    return dropped
