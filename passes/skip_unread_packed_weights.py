"""Pass, skip unread packed weights: a weight whose every NVFP4 GEMM reads its on-grid BF16 copy
(`targets.emit_ongrid_weight`: the learner's shapes on CUDA) is quantized on-grid only, its
`quantize_with_ongrid` node switched to packed=False. Nothing in such a graph reads the packed
codes and scales (the forward and, through autograd, the dgrad read the copy; the ops take N
and K from it), and writing them cost ~0.8 ms of a ~31 ms H200 learner step
(`benchmarks/results/2026-12-04_quantize_2c9e3e9.md`: 128 experts' gate_up 0.97 ms with both
outputs vs 0.70 ms on-grid only). The same bits everywhere they are read. A weight with any
other reader (a GEMM without the copy, an output, anything else) keeps its packed bytes; the
exported rollout graph never has on-grid copies, so its weights are always packed."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..codegen.nvfp4.gemm_call import GemmCall, is_gemm
from ..codegen.nvfp4.op_args import QuantizeArg
from ..codegen.nvfp4.op_args import QuantizeOut as Out
from ..recipe import NVFP4Recipe
from .graph_utils import propagate_val
from .report import LoweringReport


def _getitems(node: fx.Node) -> dict[int, list[fx.Node]]:
    out: dict[int, list[fx.Node]] = {}
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            return {}
        out.setdefault(user.args[1], []).append(user)
    return out


# the GEMMs a weight's on-grid copy is handed to (`targets.emit_ongrid_weight`)
GEMMS = ("nvfp4_linear", "nvfp4_grouped_mm")


def _only_gemms_with(readers, copy: fx.Node, gemms) -> bool:
    return all(is_gemm(u, *gemms) and GemmCall.of(u).w_ongrid is copy for u in readers)


def packed_bytes_unread(q: fx.Node, gemms=GEMMS) -> bool:
    """Whether no node reads the packed codes / scales of `quantize_with_ongrid` node q: every
    reader of codes, and of the scales' uint8 view, is an NVFP4 GEMM also given q's copy."""
    items = _getitems(q)
    copies = items.get(Out.ONGRID, [])
    if len(copies) != 1 or set(items) - {
        Out.CODES,
        Out.BLOCK_SCALES,
        Out.GLOBAL_DECODE,
        Out.ONGRID,
    }:
        return False
    copy = copies[0]
    codes_readers = [u for g in items.get(Out.CODES, []) for u in g.users]
    scale_views = [u for g in items.get(Out.BLOCK_SCALES, []) for u in g.users]
    if not all(
        v.op == "call_function" and v.target is torch.ops.aten.view.dtype for v in scale_views
    ):
        return False
    scale_readers = [u for v in scale_views for u in v.users]
    return _only_gemms_with(codes_readers, copy, gemms) and _only_gemms_with(
        scale_readers, copy, gemms
    )


def is_ongrid_only(q: fx.Node) -> bool:
    """Whether `quantize_with_ongrid` node q writes no packed bytes (packed=False)."""
    return len(q.args) > QuantizeArg.PACKED and not q.args[QuantizeArg.PACKED]


def set_packed(q: fx.Node, packed: bool) -> None:
    """Switch `quantize_with_ongrid` node q to packed=`packed`, its outputs' metadata after it."""
    q.args = (*q.args[: QuantizeArg.PACKED], packed)
    propagate_val(q)
    for item in list(q.users):
        propagate_val(item)
        for view in item.users:
            if view.op == "call_function" and view.target is torch.ops.aten.view.dtype:
                propagate_val(view)


def skip_unread_packed_weights(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport):
    ops = torch.ops.fp4_compile
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not ops.quantize_with_ongrid.default:
            continue
        if is_ongrid_only(node):
            continue
        if packed_bytes_unread(node):
            set_packed(node, False)
            report.count("packed_weight_skipped")
    gm.recompile()
