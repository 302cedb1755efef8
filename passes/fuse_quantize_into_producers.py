"""Pass, fuse quantize into producers: where an NVFP4 GEMM's per-row activation quantize reads
the output of an op minite owns that holds whole rows, that op writes the GEMM's operand in its
epilogue (the row's amax is known before its blocks are encoded), and the separate quantize
launch and its read of the tensor disappear:
- RMSNorm: `quantize_activation(detach(invariant_rms_norm))` (the shared quantize of q/k/v, of
  a dense MLP's gate/up) -> the outputs of `fp4_compile::rms_norm_quantize`; an experts' GEMM
  (`nvfp4_grouped_mm`) reading a norm's output (the MoE block's normed X, its token gather
  folded into x_index) -> `nvfp4_grouped_mm_quantized` on the norm's operand (no transposed
  operand: the experts' wgrad quantizes each expert's gathered X^T itself);
- SwiGLU: an experts' down GEMM reading `silu_mul_halves` -> `nvfp4_grouped_mm_quantized` on
  the operand of `fp4_compile::silu_mul_halves_quantize`; a dense down projection reading
  `silu_mul` -> `nvfp4_linear_quantized` on the operands of `fp4_compile::silu_mul_quantize`
  (X^T's too where an NVFP4 wgrad reads it).
Per-row activation scales only (per tensor needs the whole tensor's amax first). The producer's
output keeps every other reader. The same bits (tests/passes/test_fuse_quantize_into_producers.py);
`explain` counts `rms_norm_quantize_fused`, `silu_mul_quantize_fused`, `expert_input_from_norm`
and `expert_input_from_silu_mul`."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen.nvfp4.gemm_call import ActivationOperands, GemmCall, encode_recipe, is_gemm
from ..recipe import NVFP4Recipe
from .graph_utils import fake, insert_call
from .report import LoweringReport
from .share_activation_quantize import needs_transposed
from .targets import replace_gemm


def _ops():
    return torch.ops.fp4_compile


def _is(node, target) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is target


def fusable_norm(q: fx.Node, recipe: NVFP4Recipe) -> fx.Node | None:
    """The invariant_rms_norm node whose (detached) output quantize_activation node q reads,
    when the recipe scales activations per row and q takes no static amax; else None."""
    det, _, x_amax, _ = q.args
    if x_amax is not None or not _is(det, torch.ops.aten.detach.default):
        return None
    if recipe.activation.global_scale != "per_row":
        return None
    norm = det.args[0]
    return norm if _is(norm, _ops().invariant_rms_norm.default) else None


def _fuse(graph: fx.Graph, norm: fx.Node, numerics: str, transposed: bool) -> fx.Node:
    """Replace invariant_rms_norm node `norm` by rms_norm_quantize; its readers read output 0."""
    x, weight, eps = norm.args
    fused = insert_call(
        graph,
        _ops().rms_norm_quantize.default,
        (x, weight, eps, numerics, bool(transposed)),
        before=norm,
        like=norm,
    )
    y = insert_call(graph, operator.getitem, (fused, 0), before=norm, like=norm)
    norm.replace_all_uses_with(y)
    graph.erase_node(norm)
    return fused


def _output(graph: fx.Graph, fused: fx.Node, index: int) -> fx.Node:
    """getitem(fused, index): the existing node, or a new one right after `fused`."""
    for user in fused.users:
        if _is(user, operator.getitem) and user.args[1] == index:
            return user
    return insert_call(graph, operator.getitem, (fused, index), after=fused, like=fused)


def _fuse_shared_quantizes(graph: fx.Graph, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    """quantize_activation(detach(rms_norm)) -> the outputs 1..4 of rms_norm_quantize."""
    quantizes = [n for n in graph.nodes if _is(n, _ops().quantize_activation.default)]
    for q in quantizes:
        norm = fusable_norm(q, recipe)
        if norm is None or not all(_is(u, operator.getitem) for u in q.users):
            continue
        det, _, _, transposed = q.args
        fused = _fuse(graph, norm, encode_recipe(recipe), transposed)
        for item in list(q.users):
            item.replace_all_uses_with(_output(graph, fused, item.args[1] + 1))
            graph.erase_node(item)
        graph.erase_node(q)
        if not det.users:
            graph.erase_node(det)
        report.count("rms_norm_quantize_fused")


def _rows_view_of(x):
    """x's source when x is a view of it as its rows [M, H] (leading dims flattened: the same
    rows in the same order, so the norm's [M, H] operand serves), else x."""
    is_view = (x.op == "call_method" and x.target in ("view", "reshape")) or (
        x.op == "call_function"
        and x.target
        in (
            torch.ops.aten.view.default,
            torch.ops.aten.reshape.default,
            torch.ops.aten._unsafe_view.default,
        )
    )
    if not is_view or not isinstance(x.args[0], fx.Node):
        return x
    src, val = fake(x.args[0]), fake(x)
    if src is None or val is None or val.dim() != 2 or not src.is_contiguous():
        return x
    return x.args[0] if val.shape[-1] == src.shape[-1] else x


def _norm_source(graph: fx.Graph, x, numerics: str, report: LoweringReport):
    """The rms_norm_quantize node producing x, or its rows view (fusing x's invariant_rms_norm
    with no transposed operand if not fused yet), or None when x comes from elsewhere."""
    x = _rows_view_of(x)
    if (
        _is(x, operator.getitem)
        and x.args[1] == 0
        and _is(x.args[0], _ops().rms_norm_quantize.default)
    ):
        return x.args[0]
    if _is(x, _ops().invariant_rms_norm.default):
        report.count("rms_norm_quantize_fused")
        return _fuse(graph, x, numerics, False)
    return None


def _same_tensor(x):
    """x's source when x is `x.to(its own dtype)` (Dynamo's `.to`, ATen's _to_copy / to): the
    same values, else x."""
    if not isinstance(x, fx.Node) or not isinstance(x.args[0] if x.args else None, fx.Node):
        return x
    is_to = (x.op == "call_method" and x.target == "to") or (
        x.op == "call_function"
        and x.target in (torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype)
    )
    if not is_to:
        return x
    src, val = fake(x.args[0]), fake(x)
    if not isinstance(src, torch.Tensor) or not isinstance(val, torch.Tensor):
        return x
    same = val.dtype == src.dtype and val.shape == src.shape and val.device == src.device
    return x.args[0] if same else x


def _silu_source(graph: fx.Graph, x, numerics: str, report: LoweringReport):
    """The silu_mul_halves_quantize node producing x (fusing x's silu_mul_halves), or None."""
    x = _same_tensor(x)
    if _is(x, operator.getitem) and x.args[1] == 0:
        q = x.args[0]
        return q if _is(q, _ops().silu_mul_halves_quantize.default) else None
    val = fake(x)
    if not _is(x, _ops().silu_mul_halves.default) or val is None:
        return None
    if val.dtype not in (torch.bfloat16, torch.float32):
        return None
    h, row_mask = x.args[0], (x.args[1] if len(x.args) > 1 else x.kwargs.get("row_mask"))
    fused = insert_call(
        graph, _ops().silu_mul_halves_quantize.default, (h, row_mask, numerics), before=x, like=x
    )
    y = insert_call(graph, operator.getitem, (fused, 0), before=x, like=x)
    x.replace_all_uses_with(y)
    graph.erase_node(x)
    report.count("silu_mul_quantize_fused")
    return fused


def _fuse_expert_inputs(graph: fx.Graph, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    """nvfp4_grouped_mm reading a norm's output (the MoE block's normed X, gathered through
    x_index) or the SwiGLU's (the down GEMM) -> nvfp4_grouped_mm_quantized on that producer's
    operand."""
    if recipe.activation.global_scale != "per_row":
        return
    numerics = encode_recipe(recipe)
    for node in [n for n in graph.nodes if is_gemm(n, "nvfp4_grouped_mm")]:
        call = GemmCall.of(node)
        if call.x_amax is not None or node.kwargs:
            continue
        fused, source = _norm_source(graph, call.x, numerics, report), "norm"
        if fused is None:
            fused, source = _silu_source(graph, call.x, numerics, report), "silu_mul"
        if fused is None:
            continue
        operands = ActivationOperands(_output(graph, fused, 1), _output(graph, fused, 2))
        # read again: fusing the producer moved the node's x to the fused op's output
        replace_gemm(graph, node, GemmCall.of(node)._replace(x_operands=operands))
        report.count(f"expert_input_from_{source}")


def _fuse_dense_swiglu(graph: fx.Graph, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    """nvfp4_linear reading `silu_mul` (a dense MLP's down projection) -> nvfp4_linear_quantized
    on the operands of `silu_mul_quantize` (X^T's too where an NVFP4 wgrad reads it)."""
    if recipe.activation.global_scale != "per_row":
        return
    numerics = encode_recipe(recipe)
    for node in [n for n in graph.nodes if is_gemm(n, "nvfp4_linear")]:
        call = GemmCall.of(node)
        if call.x_amax is not None or node.kwargs:
            continue
        silu = _same_tensor(call.x)
        val = fake(silu) if _is(silu, _ops().silu_mul.default) else None
        if val is None or val.dtype not in (torch.bfloat16, torch.float32) or silu.kwargs:
            continue
        a, b, row_mask = (*silu.args, None)[:3]
        transposed = needs_transposed([node], recipe)
        fused = insert_call(
            graph,
            _ops().silu_mul_quantize.default,
            (a, b, row_mask, numerics, transposed),
            before=silu,
            like=silu,
        )
        y = insert_call(graph, operator.getitem, (fused, 0), before=silu, like=silu)
        silu.replace_all_uses_with(y)
        graph.erase_node(silu)
        operands = ActivationOperands(*(_output(graph, fused, i) for i in range(1, 5)))
        # read again: fusing the producer moved the node's x to the fused op's output
        replace_gemm(graph, node, GemmCall.of(node)._replace(x_operands=operands))
        report.count("silu_mul_quantize_fused")


def fuse_quantize_into_producers(
    gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport
) -> None:
    _fuse_shared_quantizes(gm.graph, recipe, report)
    _fuse_expert_inputs(gm.graph, recipe, report)
    _fuse_dense_swiglu(gm.graph, recipe, report)
    gm.recompile()
