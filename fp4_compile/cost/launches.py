"""The launch count of a decode step as it runs (CPU, shapes only, no kernel runs): the kernels
of the compiled step after AOTAutograd and Inductor's graph passes, plus the eager ATen ops the
decode program runs around it (`fp4_compile/rollout/decode_program.py`'s sampling and
bookkeeping). The command over it: `python -m benchmarks.step_cost --launches`; docs/step_cost.md
is the guide.

Compiled step: `RolloutStep` through `torch.compile` with the engine's backend pieces (the pass
pipeline, the weight store binding, Inductor's config patches), on meta tensors; Inductor's
`compile_fx` runs AOTAutograd (functionalization, Inductor's decompositions, the joint-graph
passes with constant folding off: it folds every meta value) and we take its post-grad graph
(`post_grad_passes`: the reinplacing of the KV-cache `index_put`) in place of its lowering.
Counted in that graph:
- each `fp4_compile` op: the launches its CUDA dispatch makes at its shapes
  (`launch_rules.op_launches`, citing each launcher);
- each extern ATen kernel (`rules.EXTERN`: GEMMs, sort, histc, cumsum, index_put_ ...): one;
  a `copy_` into a graph input: one (a KV cache's adds its bytes to `kv_cache_copy_bytes`), but
  none for a copy of a tensor into itself (a mutating op's, `fp4_compile::kv_cache_write`);
- every other ATen op is Inductor's: a pointwise / reduction op whose value a kernel above, the
  output or a `copy_` reads is materialized (a kernel); the others are inlined into their
  readers; materialized ops joined by data flow with no kernel between them (the same count of
  kernels on their longest input path) fuse into ONE kernel. Horizontal fusion of independent
  kernels is not modeled (it could only lower the count).
Layers: each kernel is attributed to the decoder layer whose weights or KV cache it reads, else to
the layer of its inputs (the latest), else to outside the layers (embedding, rotary tables,
mask, final norm, head); `launches_per_layer` is the most of any layer (the last layer's can be
fewer: its MoE combine may go into the final norm), `launches_by_layer` each layer's.
Eager: one decode token's `DecodeProgram._one_token` around a stub step, under a
TorchDispatchMode on meta tensors: every ATen op with a kernel is one launch, an `fp4_compile`
op its rule's count (the seeded noise is made inside `fp4_compile::sample_argmax`).
"""

from __future__ import annotations

import operator
import re
from unittest import mock

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode

from ..backend import inductor_patches
from ..codegen.nvfp4 import gemm
from ..passes import run_pipeline
from ..recipe import NVFP4Recipe
from ..rollout import decode_program
from ..rollout.kv_cache import StaticKVCache
from ..rollout.step import RolloutStep
from ..rollout.weight_store import WeightStore
from .launch_rules import NUM_SMS, Launch, op_launches
from .models import model_config
from .rollout import step_inputs
from .rules import EXTERN, VIEW_OPS, op_name

OUTSIDE = -1
_NO_KERNEL = VIEW_OPS | {"empty", "empty_strided", "empty_like", "new_empty", "_to_copy_meta"}


class _Stop(Exception):
    """Raised after the post-grad graph is captured: nothing is lowered."""


def post_grad_graph(model, recipe: str, *, batch: int, context: int, max_seq_len: int):
    """(Inductor's post-grad graph of the Tq = 1 step, names of the Dynamo placeholders in the
    same order) for `model` on the meta device, as the engine compiles it."""
    from torch._inductor.compile_fx import compile_fx  # lazy: Inductor costs seconds at import
    from torch._inductor.fx_passes import post_grad  # lazy: Inductor, as above
    from torch._inductor.fx_passes.post_grad import post_grad_passes  # lazy: Inductor, as above

    rec = getattr(NVFP4Recipe, recipe)()
    store = WeightStore(dict(model.named_parameters()))
    if not rec.quantize:  # as the engine: the BF16 q/k/v and gate/up buffers
        store.make_linear_groups()
    got: dict = {}

    def inner(gm, example_inputs, **unused):
        decompose = _on_meta(post_grad.decompose_auto_functionalized)
        with mock.patch.object(post_grad, "decompose_auto_functionalized", decompose):
            post_grad_passes(gm, True)  # is_inference
        got["graph"] = gm
        raise _Stop

    def backend(gm, example_inputs, **unused):
        run_pipeline(gm, rec)
        gm, example_inputs, _ = store.bind_dynamo_graph(gm, example_inputs)
        got["names"] = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        patches = inductor_patches(rec)
        patches.update(joint_graph_constant_folding=False, force_disable_caches=True)
        compile_fx(gm, example_inputs, config_patches=patches, inner_compile=inner)

    def as_on_cuda(device_type: str, rows: int) -> bool:  # meta tensors stand for CUDA ones
        return rows >= gemm.ONGRID_FORWARD_MIN_ROWS

    example = step_inputs(model, batch=batch, tokens=1, context=context, max_seq_len=max_seq_len)
    torch._dynamo.reset()
    step = torch.compile(RolloutStep(model).eval(), backend=backend, fullgraph=True, dynamic=False)
    try:
        with torch.no_grad(), mock.patch.object(gemm, "forward_uses_ongrid", as_on_cuda):
            step(*example)
    except Exception as e:  # Dynamo wraps the backend's exception
        if "graph" not in got:
            raise
        assert isinstance(e, _Stop) or isinstance(e.__cause__, _Stop) or "_Stop" in repr(e), e
    finally:
        torch._dynamo.reset()
    return got["graph"], got["names"]


def _on_meta(decompose_auto_functionalized):
    """Inductor's `decompose_auto_functionalized` (a mutating op such as
    `fp4_compile::kv_cache_write` back to its in-place call) for a graph of meta tensors: its
    pattern skips nodes of meta inputs, which here stand for CUDA ones."""
    from torch._inductor import pattern_matcher  # lazy: Inductor costs seconds at import

    def decompose(graph: fx.Graph) -> None:
        with mock.patch.object(pattern_matcher, "fallback_node_due_to_unsupported_type", _never):
            decompose_auto_functionalized(graph)

    return decompose


def _never(*args, **kwargs) -> bool:
    return False


def _layer_of_name(name: str) -> int | None:
    """A Dynamo placeholder's layer: a layer's parameter or KV cache (k_i, v_i -> i // 2);
    OUTSIDE for another parameter; None for a user input or a store tensor."""
    m = re.search(r"layers_modules_(\d+)_", name)
    if m:
        return int(m.group(1))
    m = re.search(r"caches_(\d+)_", name)
    if m:
        return int(m.group(1)) // 2
    return OUTSIDE if "_parameters_" in name else None


def _nbytes(v) -> int:
    return int(v.numel()) * v.element_size() if isinstance(v, torch.Tensor) else 0


def _kind(n: fx.Node) -> str:
    """'kernel', 'fusible' or 'free' (no kernel: a view, an allocation, a getitem, a copy of a
    tensor into itself: what a mutating op's decomposition leaves, which Inductor drops)."""
    if n.op != "call_function" or n.target is operator.getitem:
        return "free"
    if n.target is torch.ops.aten.copy_.default and n.args[0] is n.args[1]:
        return "free"
    name = op_name(n)
    short = name.split(".", 1)[-1]
    if name.startswith("fp4_compile.") or short in EXTERN or short == "copy_":
        return "kernel"
    if short in _NO_KERNEL or not isinstance(n.target, torch._ops.OpOverload):
        return "free"
    return "fusible"


def count_graph(gm: fx.GraphModule, names: list[str]) -> dict:
    """The launches of post-grad graph `gm` (module docstring), each with its layer."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    assert len(placeholders) == len(names), (len(placeholders), len(names))
    home = {p: _layer_of_name(nm) for p, nm in zip(placeholders, names)}
    caches = {p for p, nm in zip(placeholders, names) if re.search(r"caches_\d+_", nm)}
    kind = {n: _kind(n) for n in nodes}
    users: dict[fx.Node, list[fx.Node]] = {n: list(n.users) for n in nodes}

    def readers(n):  # the non-free users of n, through free nodes
        out, stack = [], list(users[n])
        while stack:
            u = stack.pop()
            (stack.extend(users[u]) if kind[u] == "free" else out.append(u))
        return out

    stage: dict[fx.Node, int] = {}  # kernels on the longest input path
    layer: dict[fx.Node, int | None] = {}
    for n in nodes:
        ins = n.all_input_nodes
        stage[n] = max((stage[x] + (kind[x] == "kernel") for x in ins), default=0)
        direct = [home[x] for x in ins if home.get(x) is not None]
        inherited = [layer[x] for x in ins if layer.get(x) is not None]
        layer[n] = home.get(n) if n.op == "placeholder" else max(direct or inherited, default=None)
    materialized = [
        n
        for n in nodes
        if kind[n] == "fusible"
        and any(kind[u] != "fusible" or u.op == "output" for u in readers(n))
    ]
    # fuse materialized ops that read one another through inlined ops at the same stage
    parent = {n: n for n in materialized}

    def find(n):
        while parent[n] is not n:
            n = parent[n] = parent[parent[n]]
        return n

    inside = set(materialized)
    for n in materialized:
        stack, seen = list(n.all_input_nodes), set()
        while stack:
            x = stack.pop()
            if x in seen or kind[x] == "kernel" or x.op == "placeholder":
                continue
            seen.add(x)
            if x in inside and stage[x] == stage[n]:
                parent[find(x)] = find(n)
            stack.extend(x.all_input_nodes)
    launches = []  # (layer, Launch, node names)
    for n in nodes:
        if kind[n] != "kernel":
            continue
        short = op_name(n).split(".", 1)[-1]
        if op_name(n).startswith("fp4_compile."):
            for launch in op_launches(n):
                launches.append((layer[n], launch, n))
        else:
            launches.append((layer[n], Launch(short, None), n))
    groups: dict[fx.Node, list[fx.Node]] = {}
    for n in materialized:
        groups.setdefault(find(n), []).append(n)
    for members in groups.values():
        label = "fused: " + "+".join(sorted({op_name(m).split(".", 1)[-1] for m in members}))
        lay = max((layer[m] for m in members if layer[m] is not None), default=None)
        if lay is None:  # computed from user inputs only: the one layer reading it, if one
            read_by = {layer[u] for m in members for u in readers(m) if u not in inside}
            lay = read_by.pop() if len(read_by) == 1 else None
        launches.append((lay, Launch(label[:80], None), members[0]))
    copy_bytes = 0
    for _, launch, n in launches:
        reads_cache = any(x in caches for x in n.all_input_nodes)
        if reads_cache and launch.kernel in ("copy_", "fused: clone", "fused: copy"):
            copy_bytes += _nbytes(n.meta.get("val"))
    return {"launches": launches, "kv_cache_copy_bytes": copy_bytes}


class LaunchCounter(TorchDispatchMode):
    """Counts the CUDA launches of the ops dispatched under it: an `fp4_compile` op its rule's
    launches, a view / allocation none, any other ATen op one."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._opname
        if func.namespace == "fp4_compile":
            self.ops += [
                f"{name}:{launch.kernel}" for launch in _eager_op_launches(func, args, out)
            ]
        elif func.namespace in ("aten", "prims") and name not in _NO_KERNEL:
            self.ops.append(name)
        return out


def _eager_op_launches(func, args, out) -> list[Launch]:
    """`op_launches` of an eager call: a one-node graph whose values are the call's."""
    graph = fx.Graph()
    nodes = []
    for a in args:
        if isinstance(a, torch.Tensor):
            p = graph.placeholder(f"a{len(nodes)}")
            p.meta["val"] = a
            nodes.append(p)
        else:
            nodes.append(a)
    call = graph.call_function(func, tuple(nodes))
    call.meta["val"] = out
    return op_launches(call)


def eager_ops(*, batch: int, vocab: int, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """The eager launches of one decode token around the compiled step (names, one per launch):
    `DecodeProgram._one_token` with a stub step returning meta logits."""
    meta = torch.device("meta")
    logits = torch.zeros((batch, 1, vocab), dtype=torch.bfloat16, device=meta)
    kv = torch.zeros((1, 1, 1, 1), device=meta)
    cache = StaticKVCache.from_tensors([kv], [kv])
    program = decode_program.DecodeProgram(
        lambda *args: logits,
        cache,
        batch=batch,
        sampling=decode_program.Sampling(temperature, top_k, top_p),
        vocab_size=vocab,
        max_tokens=4,
        capture=False,
    )
    counter = LaunchCounter()
    with counter:
        program._one_token()
    return counter.ops


def launch_budget(
    model, note: str, *, recipe: str, batch: int, context: int, temperature: float = 1.0
) -> dict:
    """The decode step's launch count against the budget (<= 12 per layer, <= 8 outside)."""
    cfg = model_config(model)
    gm, names = post_grad_graph(model, recipe, batch=batch, context=context, max_seq_len=context)
    counted = count_graph(gm, names)
    num_layers = cfg.num_hidden_layers
    rows = [
        {"layer": lay, "kernel": launch.kernel, "programs": launch.programs, "node": n.name}
        for lay, launch, n in counted["launches"]
    ]
    by_layer = [sum(1 for r in rows if r["layer"] == lay) for lay in range(num_layers)]
    outside = [r for r in rows if r["layer"] in (None, OUTSIDE)]
    eager = eager_ops(batch=batch, vocab=cfg.vocab_size, temperature=temperature)
    known = [r["programs"] for r in rows if r["programs"] is not None]
    per_layer, out_count = max(by_layer), len(outside) + len(eager)
    return {
        "model": note,
        "recipe": recipe,
        "batch": batch,
        "context": context,
        "layers": num_layers,
        "launches_per_layer": per_layer,
        "launches_by_layer": by_layer,
        "launches_outside_layers": out_count,
        "launches_outside_compiled": len(outside),
        "launches_eager": len(eager),
        "launches_step": len(rows) + len(eager),
        "min_programs": min(known, default=None),
        "kv_cache_copy_bytes": counted["kv_cache_copy_bytes"],
        "under_one_program_per_sm": [r for r in rows if (r["programs"] or NUM_SMS) < NUM_SMS],
        "budget": {"per_layer": 12, "outside_layers": 8},
        "budget_met": per_layer <= 12 and out_count <= 8,
        "per_layer_kernels": [r["kernel"] for r in rows if r["layer"] == by_layer.index(per_layer)],
        "outside_kernels": [r["kernel"] for r in outside],
        "eager_kernels": eager,
        "sampling": f"temperature {temperature}, top_k 0, top_p 1.0",
    }
