"""Small helpers shared by the passes: module paths from node metadata, node predicates."""

from __future__ import annotations

import re

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

_ROOT = re.compile(r"^L\['[^']*'\](\[\d+\])*\.?")
_GETATTR = re.compile(r"getattr\(([^,]+), '([^']+)'\)")
_MODULES = re.compile(r"\._modules\['([^']*)'\]")
_ORIG = re.compile(r"(^|\.)_orig_mod(\.|$)")


def clean_module_path(raw: str) -> str:
    """ "L['self'].model.layers.0.self_attn.q_proj" -> "model.layers.0.self_attn.q_proj"."""
    path = raw
    while _GETATTR.search(path):
        path = _GETATTR.sub(r"\1.\2", path)
    path = _MODULES.sub(r".\1", path)
    path = _ROOT.sub("", path)
    path = _ORIG.sub(r"\1", path).strip(".")
    return path


def module_path(node: fx.Node) -> str:
    """The innermost module a node was traced from, as a dotted name ('' at the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    raw = list(stack.values())[-1][0]
    return clean_module_path(raw)


def fake(node) -> torch.Tensor | None:
    """The FakeTensor example value of a node (None for non-tensor nodes)."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("example_value", node.meta.get("val"))
    return val if isinstance(val, torch.Tensor) else None


def is_call(node: fx.Node, *targets) -> bool:
    return node.op == "call_function" and node.target in targets


def arg(node: fx.Node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def op_name(node: fx.Node) -> str:
    """A readable, stable name for a node's target (for reports and the op census)."""
    t = node.target
    if node.op == "call_method":
        return f"Tensor.{t}"
    if isinstance(t, torch._ops.OpOverload):
        return str(t.name())
    if isinstance(t, torch._ops.OpOverloadPacket):
        return str(t._qualified_op_name)
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", str(t))
    if mod in ("torch._C._nn", "torch.nn.functional"):
        return f"F.{name}"
    if mod.startswith("torch"):
        return f"torch.{name}"
    return f"{mod}.{name}" if mod else name


def erase_dead(graph: fx.Graph, candidates) -> None:
    """Erase the candidate nodes (and, transitively, their now-unused inputs among the
    candidates) that have no users. Never touches nodes outside `candidates`, so in-place and
    side-effecting nodes elsewhere in the graph are safe."""
    pending = set(candidates)
    for node in list(pending):  # export graphs hang metadata asserts off intermediate values
        pending.update(
            u
            for u in node.users
            if u.op == "call_function" and "assert_tensor_metadata" in str(u.target)
        )
    changed = True
    while changed:
        changed = False
        for node in list(pending):
            if node.op in ("placeholder", "output", "get_attr"):
                pending.discard(node)
            elif not node.users:
                pending.discard(node)
                graph.erase_node(node)
                changed = True


def ancestors_within(node: fx.Node, stop: set) -> set:
    """Nodes reachable backwards from `node` without passing through `stop`."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        for inp in n.all_input_nodes:
            if inp not in seen and inp not in stop:
                seen.add(inp)
                todo.append(inp)
    return seen


def _meta_value(a):
    if isinstance(a, fx.Node):
        return a.meta.get("val", a.meta.get("example_value"))
    if isinstance(a, (list, tuple)):
        return type(a)(_meta_value(x) for x in a)
    return a


def known_equal(a, b) -> bool:
    """a == b for sizes that may be symbolic (torch.compile's dynamic shapes): True only where it
    holds for every value of the symbols (`statically_known_true`), so no shape guard is added."""
    # lazy: symbolic_shapes imports sympy (~0.3 s at import)
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))


def size_arg(graph: fx.Graph, node: fx.Node, dim: int, *, before: fx.Node):
    """Size `dim` of `node`'s value as an op argument: the int for a static size, else a
    `sym_size` node read from the graph."""
    size = fake(node).shape[dim]
    if isinstance(size, int):
        return size
    return insert_call(graph, torch.ops.aten.sym_size.int, (node, dim), before=before, like=before)


def propagate_val(node: fx.Node) -> None:
    """Set node.meta["val"] (and "example_value" where the graph uses it) by running the node's
    target on its inputs' fake values under the graph's FakeTensorMode."""
    args = _meta_value(tuple(node.args))
    kwargs = {k: _meta_value(v) for k, v in node.kwargs.items()}
    flat = [
        x for x in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)
    ]
    fakes = [x for x in flat if isinstance(x, FakeTensor)]
    if not fakes:  # e.g. aten.full from symbolic sizes: take the graph's fake mode
        fakes = [
            v
            for n in node.graph.nodes
            for v in [n.meta.get("val", n.meta.get("example_value"))]
            if isinstance(v, FakeTensor)
        ][:1]
    if not fakes:
        return
    mode = fakes[0].fake_mode
    with mode:
        val = node.target(*args, **kwargs)
    node.meta["val"] = val
    if "example_value" in (node.all_input_nodes[0].meta if node.all_input_nodes else {}):
        node.meta["example_value"] = val


def insert_call(
    graph: fx.Graph,
    target,
    args: tuple,
    *,
    before: fx.Node | None = None,
    after: fx.Node | None = None,
    like: fx.Node | None = None,
    kwargs: dict | None = None,
) -> fx.Node:
    """Insert call_function(target, args), copy `like`'s metadata (module stack, stack trace),
    and compute a correct meta["val"] for the new node."""
    ctx = graph.inserting_before(before) if before is not None else graph.inserting_after(after)
    with ctx:
        node = graph.call_function(target, args, kwargs or {})
    if like is not None:
        for key in ("nn_module_stack", "stack_trace", "source_fn_stack", "from_node", "seq_nr"):
            if key in like.meta:
                node.meta[key] = like.meta[key]
    propagate_val(node)
    return node


def written_args(node: fx.Node) -> list:
    """The arguments `node` may write: self of an in-place method (`x.mul_()`) or function, the
    arguments an ATen / custom op's schema marks as written, an `out=` tensor."""
    if node.op == "call_method":
        in_place = isinstance(node.target, str) and node.target.endswith("_")
        return [node.args[0]] if in_place and node.args else []
    if node.op != "call_function":
        return []
    written = [node.kwargs["out"]] if "out" in node.kwargs else []
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        for k, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                written.append(node.args[k] if k < len(node.args) else node.kwargs.get(a.name))
        return written
    name = getattr(node.target, "__name__", "")
    if name.endswith("_") and not name.startswith("_") and node.args:
        written.append(node.args[0])
    return written


def written_between(graph: fx.Graph, first: fx.Node, last: fx.Node, tensors) -> bool:
    """Whether a node after `first` and before `last` (graph order) may write one of `tensors`
    (a pass that moves a read of them from `first` to `last` must not fold across a write)."""
    tensors = {t for t in tensors if isinstance(t, fx.Node)}
    between = False
    for node in graph.nodes:
        if node is last:
            return False
        if between:
            flat = [
                a for x in written_args(node) for a in (x if isinstance(x, (list, tuple)) else (x,))
            ]
            if any(a in tensors for a in flat if isinstance(a, fx.Node)):
                return True
        between = between or node is first
    return False


def replace_with_call(graph: fx.Graph, node: fx.Node, target, args: tuple) -> fx.Node:
    """Replace `node` by call_function(target, args) in its place (its metadata carried over,
    `insert_call`); every user of node now reads the new node, and node is erased."""
    new = insert_call(graph, target, args, before=node, like=node)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


def traced_float(value):
    """A float argument as a Python float: itself, or, when Dynamo's automatic dynamic shapes
    turned a model constant (eps, softmax scale) into a symbolic float, its traced value.
    None if it is neither."""
    if isinstance(value, (float, int)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, fx.Node):
        val = value.meta.get("example_value", value.meta.get("val"))
        hint = getattr(getattr(val, "node", None), "hint", None)
        if isinstance(hint, (float, int)):
            return float(hint)
    return None


def tracks_gradients(graph: fx.Graph) -> bool:
    """Grad mode on and an input (a parameter) that requires grad: the training forward, whose
    graphs the inference-only fusions leave alone. Read on the inputs, not on a node: a lowered
    op's example value is made without autograd."""
    if not torch.is_grad_enabled():
        return False
    inputs = (fake(n) for n in graph.nodes if n.op in ("placeholder", "get_attr"))
    return any(v is not None and v.requires_grad for v in inputs)
