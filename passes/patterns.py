"""Node predicates that recognize the same op at Dynamo (torch) level and at ATen level, so one
pass pipeline serves `torch.compile` graphs and `torch.export` graphs alike."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .graph_utils import arg, fake

aten = torch.ops.aten


def is_op(node, functions=(), methods=(), overloads=()) -> bool:
    """Whether `node` calls one of `functions`, one of `methods` (a call_method), or an overload
    of one of the `overloads` packets."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method":
        return node.target in methods
    if node.op == "call_function":
        if node.target in functions:
            return True
        t = node.target
        return isinstance(t, torch._ops.OpOverload) and t.overloadpacket in overloads
    return False


def is_linear(n) -> bool:
    return is_op(
        n, functions=(torch._C._nn.linear, torch.nn.functional.linear), overloads=(aten.linear,)
    )


def is_sdpa(n) -> bool:
    return is_op(
        n,
        functions=(
            torch._C._nn.scaled_dot_product_attention,
            torch.nn.functional.scaled_dot_product_attention,
        ),
        overloads=(aten.scaled_dot_product_attention,),
    )


def is_mean(n) -> bool:
    return is_op(n, functions=(torch.mean,), methods=("mean",), overloads=(aten.mean,))


def is_pow(n) -> bool:
    return is_op(n, functions=(torch.pow,), methods=("pow",), overloads=(aten.pow,))


def is_rsqrt(n) -> bool:
    return is_op(n, functions=(torch.rsqrt,), methods=("rsqrt",), overloads=(aten.rsqrt,))


def is_add(n) -> bool:
    return is_op(n, functions=(operator.add, torch.add), methods=("add",), overloads=(aten.add,))


def is_mul(n) -> bool:
    return is_op(n, functions=(operator.mul, torch.mul), methods=("mul",), overloads=(aten.mul,))


def is_silu(n) -> bool:
    """An out-of-place SiLU (F.silu, Tensor.silu, aten.silu); in-place forms are not matched."""
    if not is_op(
        n, functions=(torch.nn.functional.silu,), methods=("silu",), overloads=(aten.silu,)
    ):
        return False
    return not (n.kwargs.get("inplace") or (len(n.args) > 1 and n.args[1] is True))


def is_sum(n) -> bool:
    return is_op(n, functions=(torch.sum,), methods=("sum",), overloads=(aten.sum,))


def is_div(n) -> bool:
    return is_op(
        n,
        functions=(operator.truediv, operator.itruediv, torch.div, torch.true_divide),
        methods=("div", "div_", "__truediv__", "__itruediv__"),
        overloads=(aten.div, aten.div_),
    )


def is_cast(n) -> bool:
    """A dtype conversion (Tensor.to / .float() / aten._to_copy / prims convert)."""
    return is_op(
        n,
        methods=("to", "float", "type"),
        overloads=(aten._to_copy, aten.to),
    )


def is_softmax(n) -> bool:
    return is_op(
        n,
        functions=(torch.softmax, torch.nn.functional.softmax),
        methods=("softmax",),
        overloads=(aten.softmax, aten._softmax),
    )


def is_masked_fill(n) -> bool:
    """x.masked_fill(mask, value), functional or in place."""
    return is_op(
        n, methods=("masked_fill", "masked_fill_"), overloads=(aten.masked_fill, aten.masked_fill_)
    )


def row_zero_mask(node: fx.Node, rows: int | None):
    """The [rows, 1] bool mask of a masked_fill node that zeroes whole rows of a [rows, K]
    tensor (transformers' expert-parallel sentinel masks), else None."""
    if len(node.args) != 3 or node.kwargs:
        return None
    mask, value = node.args[1], node.args[2]
    m = fake(mask)
    if not isinstance(value, (int, float)) or value != 0 or m is None or m.dtype != torch.bool:
        return None
    return mask if rows is not None and tuple(m.shape) == (rows, 1) else None


def is_topk(n) -> bool:
    return is_op(n, functions=(torch.topk,), methods=("topk",), overloads=(aten.topk,))


def scalar_arg(node: fx.Node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def is_last_dim_halves(split: fx.Node, source: fx.Node) -> bool:
    """Whether `split` cuts `source` [S, 2C] into two [S, C] halves along the last dim (chunk(2)
    or split(C) as a method, a torch function or an ATen op)."""
    if not is_op(
        split,
        functions=(torch.chunk, torch.split),
        methods=("chunk", "split"),
        overloads=(aten.chunk, aten.split),
    ):
        return False
    if not split.args or split.args[0] is not source:
        return False
    fs = fake(source)
    dim = arg(split, 2, "dim", 0)
    if fs is None or dim not in (-1, fs.dim() - 1):
        return False
    pieces = [u for u in split.users]
    vals = [fake(p) for p in pieces]
    half = fs.shape[-1] // 2
    return (
        all(
            p.op == "call_function"
            and p.target is operator.getitem
            and v is not None
            and tuple(v.shape) == (fs.shape[0], half)
            for p, v in zip(pieces, vals)
        )
        and fs.shape[-1] % 2 == 0
    )


def _is_sort(node) -> bool:
    return is_op(node, functions=(torch.sort,), methods=("sort",), overloads=(aten.sort,))


def sort_permutation(node) -> bool:
    """node is the indices of a sort of a 1-D tensor: a permutation of 0..S-1, int64."""
    if not (isinstance(node, fx.Node) and node.op == "call_function"):
        return False
    if node.target is not operator.getitem or node.args[1] != 1 or not _is_sort(node.args[0]):
        return False
    keys, perm = fake(arg(node.args[0], 0, "input")), fake(node)
    return (
        keys is not None
        and perm is not None
        and keys.dim() == 1
        and perm.dim() == 1
        and (perm.dtype == torch.int64 and perm.shape == keys.shape)
    )


_PURE_READERS = (operator.floordiv, torch.empty_like)


def aliases_or_writes(user, tensor) -> bool:
    """Whether `user` may write `tensor` or make a view of it (through which a later node could
    write it). Conservative: only known non-aliasing reads are let through."""
    if user.op != "call_function":
        return True  # methods (view, reshape, in-place ops, ...) and modules
    if user.target is operator.getitem:  # x[tensor] reads it; tensor[...] may be a view
        return user.args[0] is tensor
    if user.target is operator.setitem:  # x[tensor] = v / x[i] = tensor read it
        return user.args[0] is tensor
    if user.target in _PURE_READERS:
        return False
    schema = getattr(user.target, "_schema", None)
    if schema is None:
        return True
    for k, a in enumerate(schema.arguments):
        value = user.args[k] if k < len(user.args) else user.kwargs.get(a.name)
        values = value if isinstance(value, (list, tuple)) else (value,)
        if a.alias_info is not None and any(v is tensor for v in values):
            return True
    return False


def unwritten_sort_permutation(node) -> bool:
    """`sort_permutation(node)` and every reader of it a plain read (no write, no view): the
    permutation it was when sorted, wherever the graph reads it."""
    return sort_permutation(node) and not any(aliases_or_writes(u, node) for u in node.users)


def floordiv_of_sort_permutation(node):
    """(perm, k) when node is `perm // k` (int k >= 1) of an unwritten sort permutation, else
    None: transformers' experts gather `hidden_states[perm // top_k]`."""
    if not is_op(node, functions=(operator.floordiv,), overloads=(aten.floor_divide, aten.div)):
        return None
    if len(node.args) != 2 or not isinstance(node.args[1], int) or node.args[1] < 1:
        return None
    if node.target is not operator.floordiv and node.target is not aten.floor_divide.default:
        if node.kwargs.get("rounding_mode") != "floor":  # aten.div.Tensor_mode
            return None
    if any(aliases_or_writes(u, node) for u in node.users):
        return None  # the index itself written or viewed after the division
    perm = node.args[0]
    return (perm, node.args[1]) if unwritten_sort_permutation(perm) else None
