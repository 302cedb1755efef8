"""Pass, lower RMSNorm: the transformers RMSNorm pattern (Qwen3, Qwen3-MoE, Llama; also Qwen3's
per-head q_norm / k_norm)

    x32 = x.to(float32); var = x32.pow(2).mean(-1, keepdim=True)
    y = weight * (x32 * rsqrt(var + eps)).to(x.dtype)

becomes one batch-invariant `fp4_compile` rms_norm op (one row per program, fixed reduction
order). Matched at torch level (Dynamo) and ATen level (export) alike.
"""

from __future__ import annotations

import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import ancestors_within, erase_dead, fake, traced_float
from .patterns import is_add, is_cast, is_mean, is_mul, is_pow, is_rsqrt, scalar_arg
from .report import LoweringReport
from .targets import emit_rms_norm


def _is_metadata_assert(node: fx.Node) -> bool:
    return node.op == "call_function" and "assert_tensor_metadata" in str(node.target)


def _single_user(node: fx.Node, pred) -> fx.Node | None:
    users = [u for u in node.users if not _is_metadata_assert(u)]
    if len(users) == 1 and pred(users[0]):
        return users[0]
    return None


def _other(node: fx.Node, known: fx.Node):
    a, b = node.args[0], node.args[1]
    return b if a is known else a if b is known else None


def _match(mean: fx.Node):
    """Return (x, weight or None, eps, output node) or None."""
    powed = mean.args[0]
    if not is_pow(powed) or scalar_arg(powed, 1, "exponent") != 2:
        return None
    x32 = powed.args[0]
    dims = scalar_arg(mean, 1, "dim")
    keepdim = scalar_arg(mean, 2, "keepdim", False)
    src = fake(x32)
    if src is None or not keepdim or dims not in (-1, [-1], (-1,), src.dim() - 1, [src.dim() - 1]):
        return None
    add = _single_user(mean, is_add)
    if add is None:
        return None
    eps = traced_float(_other(add, mean))  # a model constant; symbolic under automatic dynamic
    if eps is None:
        return None
    rsqrt = _single_user(add, is_rsqrt)
    if rsqrt is None:
        return None
    normed = _single_user(rsqrt, is_mul)
    if normed is None or _other(normed, rsqrt) is not x32:
        return None
    out = normed
    cast = _single_user(normed, is_cast)
    if cast is not None:
        out = cast
    weight = None
    scaled = _single_user(out, is_mul)
    if scaled is not None:
        w = _other(scaled, out)
        wv = fake(w)
        if (
            isinstance(w, fx.Node)
            and wv is not None
            and wv.dim() == 1
            and wv.shape[0] == src.shape[-1]
        ):
            weight, out = w, scaled
    x = x32.args[0] if is_cast(x32) else x32
    return x, weight, eps, out


def lower_rms_norm(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    for mean in list(graph.nodes):
        if not is_mean(mean):
            continue
        match = _match(mean)
        if match is None:
            continue
        x, weight, eps, out = match
        out_val = fake(out)
        dtype = out_val.dtype if out_val is not None else None
        new = emit_rms_norm(graph, out, x, weight, eps, dtype)
        out.replace_all_uses_with(new)
        keep = {x} | ({weight} if weight is not None else set())
        erase_dead(graph, {out} | ancestors_within(out, keep))
        report.count("rms_norm")
    gm.recompile()
