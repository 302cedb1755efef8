"""Pass, fuse rotary into norm pairs: an attention's q / k norm pair followed by transformers'
rotary embedding (`apply_rotary_pos_emb`: Qwen3's q_norm / k_norm, then the heads transposed)

    ya, yb = invariant_rms_norm_pair(a, wa, b, wb, eps)
    q = ya.transpose(1, 2);  k = yb.transpose(1, 2)
    q_embed = (q * cos.unsqueeze(1)) + (rotate_half(q) * sin.unsqueeze(1))   (k_embed alike)
        -> q_embed, k_embed = invariant_rms_norm_pair_rotary(a, wa, b, wb, eps, cos, sin, 1.0)

(q_embed, k_embed contiguous [B, H, T, D], the layout the rotary's kernels wrote).
ONE launch instead of the norm pair and Inductor's two rotary kernels. Where the tables are the
rotary embedding's `(t32 * attention_scaling).to(dtype)` (transformers' form), the op reads t32
and the scaling and does that cast itself, so the tables need no kernel of their own. The op rounds as the
graph's ops do (each product and the sum to the dtype: `codegen/invariant/rms_norm_rotary.py`),
so q_embed and k_embed keep their bits (tests/passes/test_fuse_rotary_into_norm_pairs.py).
Inference graphs only (the op has no backward): a graph that tracks a gradient of the norms'
inputs keeps the unfused ops; bf16 only (the roundings it reproduces are bf16's; an FP32
graph's sum may be contracted into an FMA by the compiler). Each pair that does not match is
left as it is with the reason in `report.notes`; `explain` counts `rotary_fused_into_norms`.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, fake, insert_call, written_between
from .patterns import is_add, is_mul, is_op
from .report import LoweringReport

aten = torch.ops.aten


def _pair_op():
    return torch.ops.fp4_compile.invariant_rms_norm_pair.default


class _NoMatch(Exception):
    """Why a norm pair is left unfused (the message goes to report.notes)."""


def _only_user(node: fx.Node, what: str) -> fx.Node:
    users = list(node.users)
    if len(users) != 1:
        raise _NoMatch(f"{what} has {len(users)} readers, not one")
    return users[0]


def _int_args(node: fx.Node, *names_defaults) -> list:
    """node's positional-or-keyword arguments after the first, by (name, default)."""
    out = []
    for i, (name, default) in enumerate(names_defaults, start=1):
        out.append(node.args[i] if len(node.args) > i else node.kwargs.get(name, default))
    return out


def _dim(d, ndim: int):
    return d + ndim if isinstance(d, int) and d < 0 else d


def _is_transpose_1_2(node: fx.Node) -> bool:
    if not is_op(node, functions=(torch.transpose,), methods=("transpose",), overloads=(aten.transpose,)):  # fmt: skip
        return False
    d0, d1 = _int_args(node, ("dim0", None), ("dim1", None))
    return {_dim(d0, 4), _dim(d1, 4)} == {1, 2}


def _half(node: fx.Node, src: fx.Node, d: int) -> str | None:
    """'low' / 'high' if node is src[..., :d/2] / src[..., d/2:] (Dynamo getitem or aten.slice)."""
    half = d // 2
    if node.op == "call_function" and node.target is operator.getitem and node.args[0] is src:
        idx = node.args[1]
        if isinstance(idx, tuple) and len(idx) == 2 and idx[0] is Ellipsis:
            s = idx[1]
            if isinstance(s, slice) and s.step in (None, 1):
                if s.start in (None, 0) and s.stop == half:
                    return "low"
                if s.start == half and s.stop in (None, d):
                    return "high"
        return None
    if is_op(node, overloads=(aten.slice,)) and node.args[0] is src:
        dim, start, end = _int_args(node, ("dim", 0), ("start", None), ("end", None))
        step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
        if _dim(dim, 4) != 3 or step != 1:
            return None
        if start in (None, 0) and end == half:
            return "low"
        if start == half and (end is None or end >= d):
            return "high"
    return None


def _unsqueezed_1(node) -> fx.Node | None:
    """t if node is t.unsqueeze(1) (any form), else None."""
    if not is_op(node, functions=(torch.unsqueeze,), methods=("unsqueeze",), overloads=(aten.unsqueeze,)):  # fmt: skip
        return None
    (d,) = _int_args(node, ("dim", None))
    return node.args[0] if _dim(d, 4) == 1 else None


def _finished_table(table: fx.Node) -> tuple[fx.Node, float, list[fx.Node]]:
    """(t32, scaling, the cast's nodes) where table = (t32 * scaling).to(bf16) with t32 FP32 (the
    rotary embedding's last steps), else (table, 1.0, [])."""
    vt = fake(table)
    if vt is None or vt.dtype != torch.bfloat16:
        return table, 1.0, []
    if is_op(table, methods=("to",), overloads=(aten.to, aten._to_copy)):
        src, rest = table.args[0], [*table.args[1:], *table.kwargs.items()]
        if rest not in ([torch.bfloat16], [("dtype", torch.bfloat16)]):
            return table, 1.0, []
        v = fake(src) if isinstance(src, fx.Node) else None
        if v is not None and v.dtype == torch.float32 and is_mul(src) and len(src.args) == 2:
            x, scale = src.args
            vx = fake(x) if isinstance(x, fx.Node) else None
            if vx is not None and vx.dtype == torch.float32 and type(scale) in (float, int):
                if tuple(vx.shape) == tuple(vt.shape) and not src.kwargs:
                    return x, float(scale), [table, src]
    return table, 1.0, []


def _other(node: fx.Node, one: fx.Node):
    a, b = node.args[:2]
    return b if a is one else a if b is one else None


def _rotary(y: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node, list[fx.Node], list[fx.Node]]:
    """(embed, cos, sin, its nodes, its unsqueezed tables) of y = getitem(pair, i), read only
    by the rotary."""
    vy = fake(y)
    if vy is None or vy.dim() != 4:
        raise _NoMatch("the normed heads are not [B, T, H, D]")
    d = int(vy.shape[-1])
    t = _only_user(y, "a normed output")
    if not _is_transpose_1_2(t):
        raise _NoMatch(f"{t.name} is not the heads' transpose(1, 2)")
    readers = list(t.users)
    if len(readers) != 3:
        raise _NoMatch(f"the transposed heads have {len(readers)} readers, not the rotary's 3")
    halves = {_half(n, t, d): n for n in readers}
    muls = [n for n in readers if is_mul(n) and len(n.args) == 2 and not n.kwargs]
    if set(halves) != {"low", "high", None} or len(muls) != 1:
        raise _NoMatch("the heads are not read as q * cos, q[..., :D/2], q[..., D/2:]")
    x1, x2, m1 = halves["low"], halves["high"], muls[0]
    neg = _only_user(x2, "rotate_half's high half")
    if not is_op(neg, functions=(operator.neg, torch.neg), methods=("neg",), overloads=(aten.neg,)):  # fmt: skip
        raise _NoMatch("rotate_half's high half is not negated")
    cat = _only_user(neg, "rotate_half's negated half")
    if _only_user(x1, "rotate_half's low half") is not cat or not is_op(cat, functions=(torch.cat,), overloads=(aten.cat,)):  # fmt: skip
        raise _NoMatch("rotate_half is not cat((-x2, x1))")
    parts = cat.args[0]
    (dim,) = _int_args(cat, ("dim", 0))
    if list(parts) != [neg, x1] or _dim(dim, 4) != 3:
        raise _NoMatch("rotate_half is not cat((-x2, x1), dim=-1)")
    m2 = _only_user(cat, "rotate_half(q)")
    if not is_mul(m2) or len(m2.args) != 2 or m2.kwargs:
        raise _NoMatch("rotate_half(q) is not multiplied by sin")
    add = _only_user(m1, "q * cos")
    if _only_user(m2, "rotate_half(q) * sin") is not add or not is_add(add):
        raise _NoMatch("q * cos and rotate_half(q) * sin are not added")
    if len(add.args) != 2 or add.kwargs or set(add.args) != {m1, m2} or add.args[0] is not m1:
        raise _NoMatch("the rotary's sum is not (q * cos) + (rotate_half(q) * sin)")
    cu, su = _other(m1, t), _other(m2, cat)
    cos, sin = _unsqueezed_1(cu), _unsqueezed_1(su)
    if cos is None or sin is None:
        raise _NoMatch("cos / sin are not [B, T, D] tables unsqueezed at the heads' dim")
    want = [(*vy.shape[:2], d), (1, vy.shape[1], d)]
    for name, table in (("cos", cos), ("sin", sin)):
        v = fake(table)
        if v is None or tuple(v.shape) not in want or v.dtype != vy.dtype:
            raise _NoMatch(f"{name} is not {list(want[0])} (or B 1) of the heads' {vy.dtype}")
    return add, cos, sin, [add, m2, m1, cat, neg, x1, x2, t], [cu, su]


def _check_pair(graph: fx.Graph, pair: fx.Node) -> tuple[fx.Node, fx.Node]:
    if torch.is_grad_enabled() and any(
        v is not None and v.requires_grad for v in (fake(x) for x in pair.all_input_nodes)
    ):
        raise _NoMatch("the graph tracks a gradient (the fused op is for inference graphs)")
    va = fake(pair.args[0])
    if va is None or va.dtype != torch.bfloat16:
        raise _NoMatch(f"the heads are {None if va is None else va.dtype}, not bfloat16")
    for w in (pair.args[1], pair.args[3]):
        vw = fake(w) if isinstance(w, fx.Node) else None
        if w is not None and (vw is None or vw.dtype != torch.bfloat16):
            raise _NoMatch("a norm weight is not bfloat16")
    gets = sorted(pair.users, key=lambda n: n.args[1] if n.target is operator.getitem else -1)
    if len(gets) != 2 or [g.args[1] for g in gets if g.target is operator.getitem] != [0, 1]:
        raise _NoMatch("the pair's outputs are not read through getitem 0 and 1")
    return gets[0], gets[1]


def _fuse(graph: fx.Graph, pair: fx.Node) -> None:
    ya, yb = _check_pair(graph, pair)
    qe, qcos, qsin, q_nodes, tables = _rotary(ya)
    ke, kcos, ksin, k_nodes, k_tables = _rotary(yb)
    if (qcos, qsin) != (kcos, ksin) or fake(qcos).shape != fake(qsin).shape:
        raise _NoMatch("q and k are rotated with different cos / sin tables")
    (cos, scale_c, cast_c), (sin, scale_s, cast_s) = map(_finished_table, (qcos, qsin))
    if scale_c != scale_s:
        cos, sin, scale_c, cast_c, cast_s = qcos, qsin, 1.0, [], []
    a, wa, b, wb, eps = pair.args
    target = torch.ops.fp4_compile.invariant_rms_norm_pair_rotary.default
    args = (a, wa, b, wb, eps, cos, sin, scale_c)
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min(qe, ke, key=order.__getitem__)  # every input is ready there (the tables too)
    if written_between(graph, pair, first, (a, b, wa, wb)):
        raise _NoMatch("the heads or the weights are written between the pair and the rotary")
    fused = insert_call(graph, target, args, before=first, like=pair)
    ra = insert_call(graph, operator.getitem, (fused, 0), after=fused, like=ya)
    rb = insert_call(graph, operator.getitem, (fused, 1), after=ra, like=yb)
    qe.replace_all_uses_with(ra)
    ke.replace_all_uses_with(rb)
    for n in [*q_nodes, *k_nodes, ya, yb, pair]:
        graph.erase_node(n)
    # the unsqueezed tables and their casts, once unread (the last pair's fusion erases them)
    erase_dead(graph, [*tables, *k_tables, *cast_c, *cast_s])


def fuse_rotary_into_norm_pairs(
    gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport
) -> None:
    graph = gm.graph
    for pair in [n for n in graph.nodes if n.op == "call_function" and n.target is _pair_op()]:
        try:
            _fuse(graph, pair)
        except _NoMatch as why:
            report.notes.append(f"{pair.name}: rotary not fused into the norm pair ({why})")
            continue
        report.count("rotary_fused_into_norms")
    gm.recompile()
