"""Pass, lower attention: `scaled_dot_product_attention` (what transformers' "sdpa" attention
implementation calls, after repeat_kv or with enable_gqa) becomes the batch-invariant
`fp4_compile` attention op: keys visited in fixed-size blocks from position 0, the same for the
learner's full forward, the rollout's prefill and its decode steps.

Grouped-query attention's key/value repeat (transformers' `repeat_kv`: expand + reshape, a
copy of K and V per query head, over the whole static cache in decode) is removed: the op reads
the KV heads in place (query head h reads KV head h // G) and its backward sums each group's
dK / dV in a fixed order, the bits of the repeat it replaces (`codegen/invariant/attention.py`).

Supported: is_causal=True, or a boolean attn_mask (True = attend; what transformers builds under
torch.compile: causal plus padding), or neither with Tq=1 (decode against the whole cache).
Masked keys are exact no-ops of the online softmax (exp(-inf) = 0, the running max unchanged),
so a masked full forward equals an unmasked decode bitwise. Dropout and additive float masks are
refused with a clear error.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, fake, insert_call, module_path, size_arg, traced_float
from .patterns import is_op, is_sdpa, scalar_arg
from .report import LoweringReport
from .targets import emit_attention


class UnsupportedAttention(ValueError):
    pass


aten = torch.ops.aten


def _is_reshape(n) -> bool:
    return is_op(
        n,
        functions=(torch.reshape,),
        methods=("reshape", "view"),
        overloads=(aten.reshape, aten.view, aten._unsafe_view),
    )


def _is_expand(n) -> bool:
    return is_op(n, methods=("expand",), overloads=(aten.expand,))


def _is_clone(n) -> bool:
    return is_op(
        n, functions=(torch.clone,), methods=("clone", "contiguous"), overloads=(aten.clone,)
    )


def drop_repeat_kv(graph: fx.Graph, node: fx.Node, t, report: LoweringReport, dead: list):
    """If `t` (a key or value of attention `node`) is grouped-query attention's repeat,
    x[:, :, None].expand(B, H, n, T, D).reshape(B, H * n, T, D) (torch level; at ATen level with
    a clone between expand and view), return the KV heads themselves, x [B, H, 1, T, D] viewed
    as [B, H, T, D] (`aten.squeeze.dim`, a view: no copy), for the attention op to read in place.
    Else `t` unchanged. The replaced nodes go to `dead` (erased once unused)."""
    if not _is_reshape(t):
        return t
    src = t.args[0]
    middle = [t]
    if _is_clone(src):
        middle.append(src)
        src = src.args[0]
    if not _is_expand(src):
        return t
    middle.append(src)
    x = src.args[0]
    xv, ev, rv = fake(x), fake(src), fake(t)
    if xv is None or ev is None or rv is None or (xv.dim(), ev.dim(), rv.dim()) != (5, 5, 4):
        return t
    n = ev.shape[2]
    same = (*xv.shape[:2], *xv.shape[3:]) == (*ev.shape[:2], *ev.shape[3:])
    if not (isinstance(n, int) and xv.shape[2] == 1 and same):
        return t
    if not (isinstance(rv.shape[1], int) and isinstance(xv.shape[1], int)) or (
        rv.shape[1] != xv.shape[1] * n
    ):
        return t
    heads = insert_call(graph, aten.squeeze.dim, (x, 2), before=node, like=node)
    report.count("repeat_kv_dropped")
    dead.extend(middle)
    return heads


def _is_shape_view(n) -> bool:
    """A view that can keep a tensor's shape and layout: squeeze / unsqueeze / alias, a slice,
    or indexing with full slices and None only (`x[:, :, None]`)."""
    if is_op(n, functions=(operator.getitem,)):
        index = n.args[1] if isinstance(n.args[1], tuple) else (n.args[1],)
        return all(i is None or i is Ellipsis or i == slice(None) for i in index)
    return is_op(
        n,
        functions=(torch.squeeze, torch.unsqueeze),
        methods=("squeeze", "unsqueeze"),
        overloads=(aten.squeeze, aten.unsqueeze, aten.slice, aten.alias),
    )


def paged_source(t, gather_op) -> tuple | None:
    """(pool, block_table, nodes) if `t` is a paged cache's layer, `gather_op(pool, block_table)`
    (`fp4_compile::gather_kv_pages`), seen through views that end in its own shape (so no key is
    dropped or moved); `nodes`: the gather and those views. Else None."""
    chain = []
    while _is_shape_view(t):
        chain.append(t)
        t = t.args[0]
    if not (isinstance(t, fx.Node) and t.op == "call_function" and t.target == gather_op):
        return None
    tv, first = fake(t), fake(chain[0] if chain else t)
    if tv is None or first is None or tuple(tv.shape) != tuple(first.shape):
        return None
    return t.args[0], t.args[1], [*chain, t]


def _static_scale(scale, q, where: str):
    """The softmax scale as a Python float. Under automatic dynamic shapes Dynamo may turn the
    model's float attribute into a symbolic value; only the default D**-0.5 is accepted then
    (checked against the traced value), never a guess."""
    if not isinstance(scale, fx.Node):
        return scale
    default = float(fake(q).shape[-1]) ** -0.5
    hint = traced_float(scale)
    if hint is None or hint != default:
        raise UnsupportedAttention(
            f"attention at {where} has a symbolic softmax scale (traced value {hint}); only the default "
            f"head_dim**-0.5 = {default} can be lowered from a symbolic scale"
        )
    return default


def lower_attention(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if not is_sdpa(node):
            continue
        q, k, v = node.args[:3]
        mask = scalar_arg(node, 3, "attn_mask")
        dropout = scalar_arg(node, 4, "dropout_p", 0.0)
        is_causal = scalar_arg(node, 5, "is_causal", False)
        scale = node.kwargs.get("scale", node.args[6] if len(node.args) > 6 else None)
        where = module_path(node) or "<root>"
        scale = _static_scale(scale, q, where)
        if isinstance(is_causal, fx.Node):
            raise UnsupportedAttention(
                f"attention at {where} has a data-dependent is_causal; not supported"
            )
        mv = fake(mask)
        if mask is not None and (mv is None or mv.dtype != torch.bool):
            raise UnsupportedAttention(
                f"attention at {where} has a non-boolean attn_mask ({getattr(mv, 'dtype', mask)}); "
                "minite's invariant attention takes boolean masks (True = attend) or is_causal"
            )
        if isinstance(dropout, fx.Node):
            raise UnsupportedAttention(
                f"attention at {where} reads dropout_p from the graph ({dropout.name}): "
                "torch.compile(..., dynamic=True) traces Python floats as graph inputs; compile "
                "with dynamic=False, or set the model to eval"
            )
        if dropout not in (0.0, 0):
            raise UnsupportedAttention(
                f"attention at {where} uses dropout_p={dropout}; set the model to eval / dropout 0"
            )
        qv = fake(q)
        if (
            mask is None
            and not is_causal
            and qv is not None
            and isinstance(qv.shape[-2], int)
            and qv.shape[-2] > 1
        ):
            raise UnsupportedAttention(
                f"attention at {where} is non-causal with {qv.shape[-2]} queries; not supported"
            )
        dead: list = []
        k = drop_repeat_kv(graph, node, k, report, dead)
        v = drop_repeat_kv(graph, node, v, report, dead)
        gather = torch.ops.fp4_compile.gather_kv_pages.default
        paged_k, paged_v = paged_source(k, gather), paged_source(v, gather)
        if paged_k is not None and paged_v is not None and paged_k[1] is paged_v[1]:
            tk = fake(k).shape[2]
            if not isinstance(tk, int):  # the table's width x the page size, from the graph
                width, page = (
                    size_arg(graph, t, dim, before=node)
                    for t, dim in ((paged_k[1], 1), (paged_k[0], 2))
                )
                tk = insert_call(graph, operator.mul, (width, page), before=node, like=node)
            dead.extend(paged_k[2] + paged_v[2])
            report.count("paged_attention")
            new = emit_attention(
                graph,
                node,
                q,
                paged_k[0],
                paged_v[0],
                mask,
                bool(is_causal),
                scale,
                block_table=paged_k[1],
                tk=tk,
            )
        else:
            new = emit_attention(graph, node, q, k, v, mask, bool(is_causal), scale)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        erase_dead(graph, dead)
        report.count("attention")
    gm.recompile()
