"""What the lowering passes insert: one place that binds graph nodes to fp4_compile ops.

Every `emit_*` inserts `torch.ops.fp4_compile.*` (and a few ATen) op overloads only, with correct
meta["val"], so the same nodes serve Dynamo graphs, Inductor and serialized exported programs.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen.nvfp4 import gemm
from ..codegen.nvfp4.gemm_call import GemmCall, QuantizedWeight
from ..codegen.nvfp4.op_args import QuantizeOut
from ..recipe import NVFP4Recipe
from ..sr_stream import site_id
from ..weight_policy import weight_quantize_mode
from .graph_utils import fake, insert_call, propagate_val, replace_with_call


def _ops():
    return torch.ops.fp4_compile


def emit_quantize_weight(graph, weight, recipe: NVFP4Recipe):
    """Nodes quantizing `weight` (16x16 tiles) right after its definition:
    detach -> fp4_compile.quantize -> (codes, block-scale bytes, global decode)."""
    det = insert_call(graph, torch.ops.aten.detach.default, (weight,), after=weight, like=weight)
    mode = weight_quantize_mode(recipe, fake(weight).dim())
    return _emit_quantize(graph, det, mode, None, after=det, weight=weight)


def emit_quantize_weight_group(graph, weights: list, recipe: NVFP4Recipe) -> list[tuple]:
    """Nodes quantizing a group of weights with ONE shared global scale
    (`NVFP4Recipe.shared_weight_scale`), right after the last of them is defined:
    detach each -> fp4_compile.weight_group_amax -> fp4_compile.quantize(w, "16x16", "shared",
    amax) each -> [(codes, block-scale bytes, global decode)] in the order of `weights`."""
    for w in weights:
        if weight_quantize_mode(recipe, fake(w).dim()) != "per_tensor":
            raise ValueError(f"a shared-scale weight group holds {w} of shape {fake(w).shape}")
    order = {n: i for i, n in enumerate(graph.nodes)}
    anchor = max(weights, key=order.__getitem__)
    dets = []
    for w in weights:
        anchor = insert_call(graph, torch.ops.aten.detach.default, (w,), after=anchor, like=w)
        dets.append(anchor)
    amax = insert_call(
        graph, _ops().weight_group_amax.default, (dets,), after=anchor, like=weights[0]
    )
    out, anchor = [], amax
    for det, w in zip(dets, weights):
        wq = _emit_quantize(graph, det, "shared", amax, after=anchor, weight=w)
        out.append(wq)
        anchor = wq[-1]
    return out


def _emit_quantize(graph, det, mode: str, amax, *, after, weight):
    """quantize(det, "16x16", mode, amax) after `after` and its outputs, `weight`'s metadata."""
    q = insert_call(
        graph,
        _ops().quantize.default,
        (det, "16x16", mode, amax, "rne", 0),
        after=after,
        like=weight,
    )
    codes = insert_call(graph, operator.getitem, (q, QuantizeOut.CODES), after=q, like=weight)
    scales = insert_call(
        graph, operator.getitem, (q, QuantizeOut.BLOCK_SCALES), after=codes, like=weight
    )
    gd = insert_call(
        graph, operator.getitem, (q, QuantizeOut.GLOBAL_DECODE), after=scales, like=weight
    )
    scales_u8 = insert_call(
        graph, torch.ops.aten.view.dtype, (scales, torch.uint8), after=gd, like=weight
    )
    return codes, scales_u8, gd


def call_site(graph, decision) -> int:
    """The stochastic-rounding call-site id of a lowered GEMM: its module path and kind, plus a
    running index for repeated uses of one module in a graph (so every site is distinct)."""
    seen = graph._minite_sites = getattr(graph, "_minite_sites", {})
    name = f"{decision.module}:{decision.kind}"
    seen[name] = seen.get(name, -1) + 1
    return site_id(f"{name}:{seen[name]}")


def forward_rows(x, num_experts: int | None = None) -> int | None:
    """The rows a GEMM's weight sees in the forward (per expert, rounded up, for MoE), from x's
    traced shape; None when the shape is symbolic (dynamic batch: decided at run time)."""
    shape = fake(x).shape
    if not all(isinstance(s, int) for s in shape):
        return None
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows if num_experts is None else max(1, -(-rows // num_experts))


def emit_ongrid_weight(graph, node, x, wq, num_experts: int | None = None):
    """The on-grid BF16 copy of a quantized weight, when the forward at x's traced shape runs
    the on-grid GEMM (`gemm.forward_uses_ongrid`); else None. The weight's quantize node
    becomes `fp4_compile::quantize_with_ongrid` (same arguments, same first three outputs, the
    copy fourth: on CUDA one pass over the weight instead of quantize, then a decode of its
    packed bytes). One copy per weight in the graph, passed as `w_ongrid` to every use: the
    forward and, saved by autograd, the dgrad read it instead of decoding the packed weight
    each (the same values: the bits do not change)."""
    rows = forward_rows(x, num_experts)
    if rows is None or not gemm.forward_uses_ongrid(fake(x).device.type, rows):
        return None
    codes = wq[0]
    made = graph._minite_ongrid = getattr(graph, "_minite_ongrid", {})
    if codes not in made:
        q = codes.args[0]
        if not (codes.target is operator.getitem and q.target is _ops().quantize.default):
            raise ValueError(f"weight codes {codes} do not come from a quantize node")
        q.target = _ops().quantize_with_ongrid.default
        propagate_val(q)
        made[codes] = insert_call(
            graph, operator.getitem, (q, QuantizeOut.ONGRID), after=q, like=node
        )
    return made[codes]


def emit_gemm(graph, call: GemmCall, *, before, like) -> fx.Node:
    """A node of the GEMM op `call` makes (its fields: nodes of the graph), before `before`."""
    return insert_call(graph, call.overload(), call.args(), before=before, like=like)


def replace_gemm(graph, node, call: GemmCall) -> fx.Node:
    """Replace GEMM node `node` by a node of `call` in its place (readers moved, node erased)."""
    return replace_with_call(graph, node, call.overload(), call.args())


def emit_nvfp4_linear(graph, node, x, weight, wq, bias, recipe: NVFP4Recipe, site: int = 0):
    """nvfp4_linear(x, weight quantized as wq = (codes, scale bytes, global decode), bias)."""
    ongrid = emit_ongrid_weight(graph, node, x, wq)
    call = GemmCall(
        x=x,
        weight=weight,
        w=QuantizedWeight(*wq),
        recipe=recipe,
        bias=bias,
        w_ongrid=ongrid,
        site=site,
    )
    return emit_gemm(graph, call, before=node, like=node)


def emit_nvfp4_grouped(graph, node, x, weight, wq, offsets, recipe: NVFP4Recipe, site: int = 0):
    """nvfp4_grouped_mm(x, weight quantized as wq, offsets)."""
    codes = wq[0]
    ongrid = emit_ongrid_weight(graph, node, x, wq, num_experts=fake(codes).shape[0])
    call = GemmCall(
        x=x,
        weight=weight,
        w=QuantizedWeight(*wq),
        recipe=recipe,
        offsets=offsets,
        w_ongrid=ongrid,
        site=site,
    )
    return emit_gemm(graph, call, before=node, like=node)


def _cast(graph, node, value, dtype, like):
    """value.to(dtype) as a graph node (or value itself when it already has that dtype)."""
    if value is None or fake(value).dtype == dtype:
        return value
    return insert_call(
        graph,
        torch.ops.aten._to_copy.default,
        (value,),
        before=node,
        like=like,
        kwargs={"dtype": dtype},
    )


def emit_bf16_linear(graph, node, x, weight, bias):
    """A GEMM that stays BF16: BF16 operands (cast if the model holds another dtype), FP32
    accumulation in the batch-invariant linear, output in x's dtype."""
    out_dtype = fake(node).dtype
    args = (
        _cast(graph, node, x, torch.bfloat16, node),
        _cast(graph, node, weight, torch.bfloat16, node),
        _cast(graph, node, bias, torch.bfloat16, node),
        out_dtype,
    )
    return insert_call(graph, _ops().invariant_linear.default, args, before=node, like=node)


def emit_bf16_grouped(graph, node, x, weight, offsets):
    out_dtype = fake(node).dtype
    args = (
        _cast(graph, node, x, torch.bfloat16, node),
        _cast(graph, node, weight, torch.bfloat16, node),
        offsets,
        out_dtype,
    )
    return insert_call(graph, _ops().invariant_grouped_mm.default, args, before=node, like=node)


def emit_rms_norm(graph, node, x, weight, eps, out_dtype):
    y = insert_call(
        graph, _ops().invariant_rms_norm.default, (x, weight, float(eps)), before=node, like=node
    )
    return _cast(graph, node, y, out_dtype, node) if out_dtype is not None else y


def _size_key(size) -> object:
    """A hashable key of a traced size: the int, or a SymInt's symbolic expression."""
    return size.node.expr if isinstance(size, torch.SymInt) else int(size)


def _val(size):
    """A size given as an int, a SymInt or a graph node (its traced value)."""
    return size.meta["val"] if isinstance(size, fx.Node) else size


def _attention_lengths(graph, node, q, k, tk=None) -> tuple[fx.Node, fx.Node]:
    """(q_start, kv_len): int64 [B] zeros and [B] Tk, ONE pair per graph for every attention of
    the same batch B, key length Tk and device (every layer's: one set of kernels per step). The
    first attention's pair is inserted before it; the pass walks the graph in order, so the
    pair precedes (dominates) every later attention that reuses it. tk: Tk given (a paged
    cache's, whose k is a page pool), else k's length."""
    qv = fake(q)
    key = (
        _size_key(qv.shape[0]),
        _size_key(fake(k).shape[2] if tk is None else _val(tk)),
        qv.device,
    )
    made = graph._minite_attention_lengths = getattr(graph, "_minite_attention_lengths", {})
    if key in made:
        return made[key]
    aten = torch.ops.aten
    b = insert_call(graph, aten.sym_size.int, (q, 0), before=node, like=node)
    if tk is None:
        tk = insert_call(graph, aten.sym_size.int, (k, 2), before=node, like=node)
    pair = tuple(
        insert_call(
            graph,
            aten.full.default,
            ([b], fill),
            before=node,
            like=node,
            kwargs={"dtype": torch.int64, "device": qv.device},
        )
        for fill in (0, tk)
    )
    made[key] = pair
    return pair


def _attention_mask_args(graph, node, mask, q, k, tk=None) -> tuple[fx.Node, fx.Node, fx.Node]:
    """(words, intervals, flag): `fp4_compile::invariant_attention_mask_args(mask, Tq, Tk)`, ONE
    per graph for every attention of the same mask node, Tq and Tk (every layer's: the mask is
    prepared once per step, not once per layer). Inserted before the first such attention,
    which it therefore precedes, with every later one (`_attention_lengths`). tk: as there."""
    sizes = (fake(q).shape[2], fake(k).shape[2] if tk is None else tk)
    key = (mask, *(_size_key(_val(s)) for s in sizes))
    made = graph._minite_attention_mask_args = getattr(graph, "_minite_attention_mask_args", {})
    if key in made:
        return made[key]
    aten = torch.ops.aten
    dims = [
        s
        if isinstance(s, (int, fx.Node))
        else insert_call(graph, aten.sym_size.int, (t, 2), before=node)
        for s, t in zip(sizes, (q, k))
    ]
    args = insert_call(
        graph, _ops().invariant_attention_mask_args.default, (mask, *dims), before=node, like=node
    )
    made[key] = tuple(
        insert_call(graph, operator.getitem, (args, i), before=node, like=node) for i in range(3)
    )
    return made[key]


def _position_mask_outputs(mask, q, k, tk=None) -> list[fx.Node] | None:
    """The six outputs (getitem nodes) of the `fp4_compile::invariant_position_mask` whose
    mask (output 0) `mask` is, when its rows and key slots are the attention's (B, Tq, Tk);
    else None. Missing getitems are inserted right after the op, which precedes the mask and so
    every attention over it."""
    if not (isinstance(mask, fx.Node) and mask.target is operator.getitem and mask.args[1] == 0):
        return None
    op = mask.args[0]
    made_by = _ops().invariant_position_mask
    if getattr(op, "target", None) not in (made_by, made_by.default):  # Dynamo's, ATen's
        return None
    qv, mv = fake(q), fake(mask)
    tk = fake(k).shape[2] if tk is None else _val(tk)
    want = (qv.shape[0], qv.shape[2], tk)
    if tuple(map(_size_key, want)) != tuple(
        map(_size_key, (mv.shape[0], mv.shape[2], mv.shape[3]))
    ):
        return None
    outs = {u.args[1]: u for u in op.users if u.target is operator.getitem}
    for i in range(6):
        if i not in outs:
            outs[i] = insert_call(op.graph, operator.getitem, (op, i), after=op, like=op)
    return [outs[i] for i in range(6)]


def emit_attention(
    graph, node, q, k, v, mask, is_causal: bool, scale, *, block_table=None, tk=None
):
    """Invariant attention over all Tk keys: causal from position 0 (sdpa's top-left causal),
    or the boolean mask; a BF16 q (cast if needed), output back in q's dtype. k and v go in as
    they are (FP32 ones are rounded to BF16 inside the op, so that the GQA group sum of their
    gradients rounds once, to their own dtype), with Hkv heads (read in place by the op). A
    mask's kernel arguments come from one `invariant_attention_mask_args` per graph
    (`_attention_mask_args`), like the lengths (`_attention_lengths`). block_table (a paged
    cache): k and v are page pools, the op reads sequence b's keys through block_table[b];
    tk is then the keys' length (the table's width x the page size: an int or a graph node)."""
    qv = fake(q)
    out_dtype = qv.dtype
    if scale is None:
        scale = float(qv.shape[-1]) ** -0.5
    qb = _cast(graph, node, q, torch.bfloat16, node) if qv.dtype == torch.float32 else q
    kb, vb = k, v
    aten = torch.ops.aten
    # the op returns a contiguous output (its fake copies q's layout): give it a contiguous q
    qb = insert_call(
        graph,
        aten.clone.default,
        (qb,),
        before=node,
        like=node,
        kwargs={"memory_format": torch.contiguous_format},
    )
    causal = bool(is_causal and mask is None)
    made = _position_mask_outputs(mask, q, k, tk)
    if made is not None:  # a position mask: its op made the lengths and kernel arguments
        args = (qb, kb, vb, made[4], made[5], mask, causal, float(scale), *made[1:4])
    else:
        q_start, kv_len = _attention_lengths(graph, node, q, k, tk)
        args = (qb, kb, vb, q_start, kv_len, mask, causal, float(scale))
        if mask is not None:  # the mask's kernel arguments, made once per graph
            args += _attention_mask_args(graph, node, mask, q, k, tk)
    if block_table is not None:
        args += (None,) * (11 - len(args)) + (block_table,)
    both = insert_call(graph, _ops().invariant_attention.default, args, before=node, like=node)
    out = insert_call(graph, operator.getitem, (both, 0), before=node, like=node)
    return _cast(graph, node, out, out_dtype, node)


def emit_routing(graph, node, logits, k: int, *, norm_topk_prob: bool = False):
    """(top-k softmax probabilities FP32, expert ids) with lower-index tie-breaking, the values
    renormalized to sum 1 when `norm_topk_prob` (the pass then removes the graph's own)."""
    args = (logits, int(k), bool(norm_topk_prob))
    return insert_call(graph, _ops().invariant_routing.default, args, before=node, like=node)


def _parameter_name(node, to_param: dict) -> str | None:
    """The state_dict name of a (detached) parameter input of an exported program, or None."""
    if node.op == "call_function" and node.target is torch.ops.aten.detach.default:
        node = node.args[0]
    return to_param.get(node.name) if node.op == "placeholder" else None


def quantized_weight_inputs(program) -> list[tuple[str, bool, list[str]]]:
    """(state_dict name, is_experts, its shared-scale group's names, [] if none) of every weight
    an exported, lowered program quantizes."""
    to_param = dict(program.graph_signature.inputs_to_parameters)
    quantize = (_ops().quantize.default, _ops().quantize_with_ongrid.default)
    out = []
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target in quantize:
            name = _parameter_name(node.args[0], to_param)
            if name is None:
                continue
            group = []
            amax = node.args[3]
            if node.args[2] == "shared" and isinstance(amax, torch.fx.Node):
                group = [_parameter_name(m, to_param) for m in amax.args[0]]
                if None in group:
                    raise ValueError(
                        f"the shared-scale group of {name!r} holds a weight that is not a "
                        f"parameter of the program: {amax.args[0]}"
                    )
            out.append((name, fake(node.args[0]).dim() == 3, group))
    return out
