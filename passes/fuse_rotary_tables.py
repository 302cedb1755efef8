"""Pass, fuse rotary tables: transformers' rotary embedding tables of positions

    angles = positions[..., None].float() * inv_freq.float()     (the FP32 outer product)
    emb = cat((angles, angles), -1);  cos = fp4_compile::cos(emb);  sin = fp4_compile::sin(emb)
        -> cos, sin = fp4_compile::rotary_tables(positions, inv_freq)

ONE launch instead of three (Inductor's angle kernel, then ATen's cos and sin, which
`lower_trig` made opaque); the op computes the same FP32 angles and calls the same math library
functions (`codegen/invariant/rotary_tables.py`), so the tables keep their bits. Inference graphs
only (grad mode off: the rollout step, the learner's log-prob passes); a training graph keeps the
ops it had. Matched on values, not spellings: each side of the product is a chain of casts and
a last-dim unsqueeze over an integer positions tensor and a 1-D inverse-frequency tensor (FP32,
or BF16 / FP16: a model cast whole), every step of it integer or FP32 (no other rounding). A cos / sin pair that does not match is
left as it is; `explain` counts `rotary_tables`.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, fake, insert_call
from .patterns import is_cast, is_mul, is_op
from .report import LoweringReport

aten = torch.ops.aten
_INTS = (torch.int64, torch.int32)
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)  # exact in FP32


def _is_unsqueeze_last(n: fx.Node) -> bool:
    """x[..., None] / x.unsqueeze(-1) / aten.unsqueeze(x, ndim): a new last dim of 1."""
    src, out = fake(n.args[0]) if n.args else None, fake(n)
    if src is None or out is None or tuple(out.shape) != (*src.shape, 1):
        return False
    if n.op == "call_function" and n.target is operator.getitem:
        return n.args[1] == (Ellipsis, None)
    return is_op(
        n, functions=(torch.unsqueeze,), methods=("unsqueeze",), overloads=(aten.unsqueeze,)
    )


def _is_convert(n: fx.Node) -> bool:
    return is_cast(n) or is_op(n, overloads=(torch.ops.prims.convert_element_type,))


def _root(n, unsqueezed: bool):
    """(root, unsqueezed seen) of a chain of casts (and, if `unsqueezed`, one last-dim
    unsqueeze) ending at n: every value below the root integer or FP32 (positions), or FP32
    only (the inverse frequencies: an integer step would truncate them, which the op does not),
    so the only rounding on it is an integer's conversion to FP32 (a BF16 / FP16 root's upcast
    is exact); None where it is not such a chain."""
    seen = False
    kept = (*_INTS, torch.float32) if unsqueezed else (torch.float32,)
    while isinstance(n, fx.Node):
        v = fake(n)
        if v is None:
            return None
        if n.op in ("call_function", "call_method") and v.dtype in kept:
            if unsqueezed and not seen and _is_unsqueeze_last(n):
                seen, n = True, n.args[0]
                continue
            if _is_convert(n):
                n = n.args[0]
                continue
        return n, seen
    return None


def _match(emb: fx.Node):
    """(positions, inv_freq) whose tables `emb` is, else None."""
    if not is_op(emb, functions=(torch.cat,), overloads=(aten.cat,)) or not emb.args:
        return None
    parts, dim = emb.args[0], emb.args[1] if len(emb.args) > 1 else emb.kwargs.get("dim", 0)
    ve = fake(emb)
    if ve is None or len(parts) != 2 or parts[0] is not parts[1] or dim not in (-1, ve.dim() - 1):
        return None
    angles = parts[0]
    va = fake(angles)
    if not is_mul(angles) or va is None or va.dtype != torch.float32 or len(angles.args) != 2:
        return None
    for a, b in (angles.args, angles.args[::-1]):
        pos, inv = _root(a, unsqueezed=True), _root(b, unsqueezed=False)
        if pos is None or inv is None or not pos[1]:
            continue
        vp, vi = fake(pos[0]), fake(inv[0])
        if vp.dtype in _INTS and vi.dtype in _FLOATS and vi.dim() == 1:
            if tuple(va.shape) == (*vp.shape, vi.shape[0]) and fake(a).dtype == torch.float32:
                return pos[0], inv[0]
    return None


def fuse_rotary_tables(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    if torch.is_grad_enabled():  # a training graph keeps its ops
        return
    graph = gm.graph
    ops = torch.ops.fp4_compile
    for emb in list(graph.nodes):
        users = list(emb.users)
        cos = [u for u in users if u.target is ops.cos.default]
        sin = [u for u in users if u.target is ops.sin.default]
        if len(cos) != 1 or len(sin) != 1 or len(users) != 2:
            continue
        found = _match(emb)
        if found is None:
            report.notes.append(f"{emb.name}: cos / sin not fused into rotary_tables")
            continue
        order = {n: i for i, n in enumerate(graph.nodes)}
        first = min(cos[0], sin[0], key=order.__getitem__)
        tables = insert_call(graph, ops.rotary_tables.default, found, before=first, like=emb)
        for i, old in enumerate((cos[0], sin[0])):
            new = insert_call(graph, operator.getitem, (tables, i), after=tables, like=old)
            old.replace_all_uses_with(new)
            graph.erase_node(old)
        erase_dead(graph, [emb, *emb.all_input_nodes, *_chain(emb)])
        report.count("rotary_tables")
    gm.recompile()


def _chain(emb: fx.Node) -> list[fx.Node]:
    """The angle's nodes above emb (the product and its casts / unsqueezes), for erase_dead."""
    out, stack = [], list(emb.all_input_nodes)
    while stack:
        n = stack.pop()
        if n.op in ("call_function", "call_method") and n not in out:
            out.append(n)
            stack.extend(n.all_input_nodes)
    return out
