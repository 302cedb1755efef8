"""Pass, fold the experts' order: transformers' grouped experts turn the routing op's expert ids
into the grouped GEMMs' row order with a stable sort, a histogram and a cumsum, then gather the
routing weights in that order (`weights.to(dtype).reshape(-1)[perm]`), take each row's token
(`perm // k`) and build the combine's inverse (`inv[perm] = arange(S)`): in a decode step five
extern kernels and five Inductor ones. When the sort's keys are (views or integer casts of) the
ids of `fp4_compile::invariant_routing`, all of it becomes `fp4_compile::expert_order`: one
launch (`codegen/moe/expert_order.py`), the same integers and the same gathered weights, bit for
bit. Runs last before `verify`: after `narrow_expert_sort_keys` (its casts are walked through),
`fold_expert_gathers` (its negative-index wrap of `perm // k` is dropped: the op's token index
is never negative) and `attach_combine_inverse` (a combine given `idx_inverse=perm` has the
inverse of perm as its index, proven there: it reads the op's inverse instead).

Folded only when every reader is understood: the sorted keys read by nothing but the histogram
(bins E over 0..E-1) and its int32 cumsum, through casts; the permutation read, not written;
exactly one gather of the weights by it. Anything else: left as it is."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, fake, insert_call, written_args, written_between
from .patterns import aliases_or_writes, is_cast, is_op, scalar_arg
from .report import LoweringReport

aten = torch.ops.aten
_VIEWS = ("reshape", "view", "flatten", "contiguous")
_VIEW_OPS = (aten.reshape, aten.view, aten._unsafe_view, aten.flatten)


def _is_view(node) -> bool:
    return is_op(
        node, functions=(torch.reshape, torch.flatten), methods=_VIEWS, overloads=_VIEW_OPS
    )


def _readers(node: fx.Node) -> list[fx.Node]:
    """node's users but an exported graph's metadata asserts (erase_dead drops those)."""
    return [u for u in node.users if u.target is not aten._assert_tensor_metadata.default]


def _is_cast(node) -> bool:
    """A dtype conversion, `.int()` / `.long()` spellings included (transformers' histogram input)."""
    return is_cast(node) or is_op(node, methods=("int", "long", "short", "byte", "double"))


def _is_routing_output(node, index: int) -> bool:
    return (
        isinstance(node, fx.Node)
        and node.op == "call_function"
        and node.target is operator.getitem
        and node.args[1] == index
        and isinstance(node.args[0], fx.Node)
        and node.args[0].target is torch.ops.fp4_compile.invariant_routing.default
    )


def _routing_ids(keys):
    """(the routing op's expert ids node [T, k], E, the views and casts in between) when `keys`
    is it through views and integer casts (`narrow_expert_sort_keys`' uint8), else None."""
    chain, node = [], keys
    while _is_view(node) or (_is_cast(node) and not fake(node).dtype.is_floating_point):
        chain.append(node)
        node = node.args[0]
    if not _is_routing_output(node, 1):
        return None
    logits = fake(node.args[0].args[0])
    return None if logits is None else (node, int(logits.shape[-1]), chain)


def _is_stable_sort(node) -> bool:
    return (
        is_op(node, functions=(torch.sort,), methods=("sort",), overloads=(aten.sort,))
        and bool(node.kwargs.get("stable", False))
        and scalar_arg(node, 2, "descending", False) is False
    )


def _offsets_chain(keys_out: fx.Node, num_experts: int):
    """(cumsum node, the nodes before it) when the sorted keys reach only `cumsum(histc(keys,
    bins=E, min=0, max=E-1), 0, dtype=int32)` through single-reader casts, else None."""
    chain, node = [keys_out], keys_out
    while len(_readers(node)) == 1 and _is_cast(_readers(node)[0]):
        node = _readers(node)[0]
        chain.append(node)
    histc = _readers(node)[0] if len(_readers(node)) == 1 else None
    if not is_op(histc, functions=(torch.histc,), methods=("histc",), overloads=(aten.histc,)):
        return None
    bounds = tuple(
        scalar_arg(histc, i, name, default)
        for i, name, default in ((1, "bins", 100), (2, "min", 0), (3, "max", 0))
    )
    if bounds != (num_experts, 0, num_experts - 1) or len(_readers(histc)) != 1:
        return None
    cumsum = _readers(histc)[0]
    if not is_op(cumsum, functions=(torch.cumsum,), methods=("cumsum",), overloads=(aten.cumsum,)):
        return None
    out = fake(cumsum)
    if scalar_arg(cumsum, 1, "dim", None) not in (0, -1) or out is None or out.dtype != torch.int32:
        return None
    return cumsum, [*chain, histc]


def _is_gather_by(node, perm) -> bool:
    """node is `src[perm]` (Dynamo's getitem, ATen's index) of a 1-D src."""
    if node.op != "call_function" or len(node.args) != 2:
        return False
    src, index = node.args
    if node.target is operator.getitem:
        return index is perm and isinstance(src, fx.Node)
    if node.target is aten.index.Tensor:
        return list(index) == [perm] and isinstance(src, fx.Node)
    return False


def _values_source(gather: fx.Node, ids: fx.Node):
    """(values [T, k], dtype, nodes in between) for `gather = values.to(dtype).reshape(-1)[perm]`
    (the cast optional), values the same shape as the ids; a clone of the routing weights that
    only copying casts read is read through (the op's output itself is never written); else
    None."""
    chain, node = [], gather.args[0]
    while _is_view(node) and fake(node.args[0]) is not None and fake(node.args[0]).dim() == 2:
        chain.append(node)
        node = node.args[0]
    if not chain:
        return None
    dtype = fake(node).dtype
    if is_cast(node) and fake(node.args[0]).dtype.is_floating_point:
        chain.append(node)
        node = node.args[0]
    if is_op(node, overloads=(aten.clone,)) and _is_routing_output(node.args[0], 0):
        # read only by casts that copy (another dtype): nothing can write the clone
        readers = _readers(node)
        if all(
            is_cast(u) and not written_args(u) and fake(u).dtype != fake(node).dtype
            for u in readers
        ):
            chain.append(node)
            node = node.args[0]
    if fake(node) is None or fake(node).shape != fake(ids).shape or not dtype.is_floating_point:
        return None
    return node, dtype, chain


def _drop_wrap(graph: fx.Graph, token: fx.Node) -> None:
    """`where(token < 0, token + rows, token)` (fold_expert_gathers' wrap) -> token."""
    for where in list(token.users):
        if not (is_op(where, overloads=(aten.where,)) and len(where.args) == 3):
            continue
        cond, wrapped, same = where.args
        if same is not token or not is_op(cond, overloads=(aten.lt,)) or cond.args != (token, 0):
            continue
        if not (is_op(wrapped, overloads=(aten.add,)) and wrapped.args[0] is token):
            continue
        where.replace_all_uses_with(token)
        erase_dead(graph, [where, cond, wrapped])


def _writes(node: fx.Node, tensor: fx.Node) -> bool:
    """node writes `tensor` (and nothing else): `tensor[i] = v`, an in-place op."""
    if node.op == "call_function" and node.target is operator.setitem:
        return node.args[0] is tensor
    return written_args(node) == [tensor]


def _use_op_inverse(graph: fx.Graph, perm: fx.Node, inverse: fx.Node) -> None:
    """Every combine given `idx_inverse=perm` reads the op's inverse as its index; the graph's
    own inverse (`inv[perm] = arange`), when nothing else reads it, is dropped."""
    combine = torch.ops.fp4_compile.moe_combine.default
    for user in list(perm.users):
        if user.target is not combine:
            continue
        given = user.kwargs.get("idx_inverse", user.args[5] if len(user.args) > 5 else None)
        if given is not perm:
            continue
        old = user.args[2]
        user.args = (*user.args[:2], inverse, *user.args[3:])
        if not isinstance(old, fx.Node):
            continue
        index_put = is_op(old, overloads=(aten.index_put, aten.index_put_))
        base = old.args[0] if index_put else old
        writers = [u for u in base.users if _writes(u, base) and not u.users]
        others = [u for u in _readers(base) if u not in writers and u is not old]
        if others or (old is not base and old.users):
            continue
        if old is base and any(u not in writers for u in _readers(old)):
            continue
        values = [w.args[2] for w in writers if len(w.args) > 2 and isinstance(w.args[2], fx.Node)]
        for w in writers:
            graph.erase_node(w)
        if old is not base and old not in writers:
            graph.erase_node(old)
        erase_dead(graph, [base, *values])


def fold_expert_order(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    graph = gm.graph
    op = torch.ops.fp4_compile.expert_order.default
    for sort in list(graph.nodes):
        if not _is_stable_sort(sort):
            continue
        found = _routing_ids(sort.args[0])
        outs = list(sort.users)
        if found is None or not all(u.target is operator.getitem for u in outs):
            continue
        ids, num_experts, key_chain = found
        k = int(fake(ids).shape[-1])
        perms = [u for u in outs if u.args[1] == 1]
        keys = [u for u in outs if u.args[1] == 0]
        if len(perms) != 1 or len(keys) > 1:
            continue
        perm = perms[0]
        if any(aliases_or_writes(u, perm) for u in perm.users):
            continue
        offsets = _offsets_chain(keys[0], num_experts) if keys else None
        if keys and offsets is None:
            continue
        gathers = [u for u in perm.users if _is_gather_by(u, perm)]
        source = _values_source(gathers[0], ids) if len(gathers) == 1 else None
        if source is None:
            continue
        values, dtype, value_chain = source
        order = {n: i for i, n in enumerate(graph.nodes)}
        if order[values] > order[sort] or written_between(graph, values, sort, (values, ids)):
            continue  # the op, in the sort's place, would read them later
        new = insert_call(graph, op, (ids, values, num_experts, dtype), before=sort, like=sort)
        out = [
            insert_call(graph, operator.getitem, (new, i), before=sort, like=sort) for i in range(5)
        ]
        sorted_values, perm_new, offsets_new, inverse, token = out
        gathers[0].replace_all_uses_with(sorted_values)
        erase_dead(graph, [gathers[0], *value_chain])
        if offsets is not None:
            cumsum, chain = offsets
            cumsum.replace_all_uses_with(offsets_new)
            erase_dead(graph, [cumsum, *chain, keys[0]])
        _use_op_inverse(graph, perm, inverse)
        for user in list(perm.users):
            is_div = is_op(
                user, functions=(operator.floordiv,), overloads=(aten.floor_divide, aten.div)
            )
            if is_div and user.args[1:] == (k,) and user.args[0] is perm:
                if (
                    user.target is aten.div.Tensor_mode
                    and user.kwargs.get("rounding_mode") != "floor"
                ):
                    continue
                user.replace_all_uses_with(token)
                graph.erase_node(user)
        _drop_wrap(graph, token)
        perm.replace_all_uses_with(perm_new)
        erase_dead(graph, [perm, sort, *key_chain])
        for unused in out:
            if not unused.users:
                graph.erase_node(unused)
        report.count("expert_order_folded")
    gm.recompile()
