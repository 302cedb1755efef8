"""Binding graphs to a `WeightStore` (`weight_store.py`): a Dynamo graph (the learner's, the
rollout engine's compiled graphs) gets new trailing placeholders, marked static for CUDA-graph
replays, that the backend appends to every call; an exported program's module gets buffers.
Either way the graph's weight quantizes become reads of the store's tensors in the forms the
site reads (`passes/bind_weight_inputs.py`), the same tensor objects the store rewrites.
A Dynamo graph that tracks no gradient (the rollout engine's) bound to a store with fuse_groups
then runs each shared-scale group's GEMMs as one GEMM over the group's buffer
(`passes/fuse_group_gemms.py`); the member placeholders no GEMM reads any more are dropped.
Its group linears that stay BF16 run as one linear over the group's BF16 buffer, which the
members' parameters are views of (`passes/fuse_group_linears.py`, `bf16_groups.py`).
Any graph that tracks no gradient then leaves its norms' decode-GEMM codes to the GEMM's
prologue (`passes/defer_decode_codes.py`), and a MoE combine read by such a norm's residual
add runs in its launch (`passes/fuse_combine_into_norms.fuse_combine_into_norm_parts`), and a
decode attention hands its output projection the per-head maxima its prologue folds
(`passes/emit_attention_parts.py`).
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

from ..passes import (
    LoweringReport,
    QuantizeSpec,
    bind_weight_inputs,
    defer_decode_codes,
    emit_attention_parts,
    fuse_combine_into_norm_parts,
    fuse_group_gemms,
    fuse_group_linears,
    site_reads,
    weight_quantize_sites,
)

PARTS = ("codes", "scales", "global_decode", "ongrid")
# a store tensor as a Dynamo graph input: static (a CUDA-graph replay reads it in place, where
# a non-static input would be copied into the graph's own buffer at every replay)
STATIC_INPUT = {"_dynamo_static_input_type": "unguarded"}


def bind_dynamo_graph(
    store, gm: fx.GraphModule, example_inputs: list, report: LoweringReport | None = None
):
    """A copy of Dynamo graph `gm` whose weight quantizes read `store` (new trailing
    placeholders), its example inputs, and the store tensors to append to every call.
    (Dynamo keeps reading its own graph's placeholders after the backend returns: the
    placeholders go into a copy.) `report` gets the group fusion's counts and notes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = {n: store.param_name(x) for n, x in zip(placeholders, example_inputs)}
    graph, old_to_new = _copy_graph(gm.graph)
    new_names = {old_to_new[n]: v for n, v in names.items() if v is not None}
    sites = weight_quantize_sites(graph, new_names.get)
    fuse = store.fuse_groups and not torch.is_grad_enabled()
    linear = torch.ops.fp4_compile.invariant_linear.default
    if not sites and not (fuse and any(n.target is linear for n in graph.nodes)):
        return gm, list(example_inputs), ()
    fake_mode = detect_fake_mode(example_inputs)
    anchor = _hoist_placeholders(graph)
    extra: list[torch.Tensor] = []
    made: dict[tuple, tuple] = {}
    placeholder: dict[int, fx.Node] = {}  # id(store tensor) -> its placeholder (one each)
    tensor_of: dict[fx.Node, torch.Tensor] = {}

    def store_input(t: torch.Tensor, part: str) -> fx.Node:
        nonlocal anchor
        if id(t) not in placeholder:
            with graph.inserting_after(anchor):
                anchor = graph.placeholder(f"minite_store_{len(extra)}_{part}")
            anchor._dynamo_source = None  # not a user input: the backend appends it
            val = fake_mode.from_tensor(t, static_shapes=True) if fake_mode else t
            anchor.meta["val"] = anchor.meta["example_value"] = val
            anchor.meta["tensor_dict"] = dict(STATIC_INPUT)
            extra.append(t)
            placeholder[id(t)] = anchor
            tensor_of[anchor] = t
        return placeholder[id(t)]

    def inputs(spec: QuantizeSpec, q: fx.Node):
        reads = site_reads(q)
        if (spec.name, reads) not in made:
            made[spec.name, reads] = tuple(
                None if t is None else store_input(t, part)
                for part, t in zip(PARTS, store.site_inputs(spec, q))
            )
        return made[spec.name, reads]

    store.sites_bound += bind_weight_inputs(graph, sites, inputs)
    if fuse:
        extra = _fuse_groups(store, graph, extra, tensor_of, store_input, report)

        def buffer(members: tuple) -> fx.Node:
            return store_input(store.linear_groups[members[0]].buffer, "linear_group")

        layout = _linear_layout(store, new_names)
        store.groups_fused += fuse_group_linears(graph, layout, buffer, report)
    if not torch.is_grad_enabled():  # after the group fusion: its one GEMM reads the parts
        defer_decode_codes(graph, report)
        fuse_combine_into_norm_parts(graph, report)  # the MoE combine into such a norm
        emit_attention_parts(graph, report)  # o_proj's row maxima from the decode attention
    graph.lint()
    new_gm = fx.GraphModule(gm, graph)
    new_gm.meta.update(gm.meta)
    for attr in ("_param_name_to_source", "shape_env"):
        if hasattr(gm, attr):
            setattr(new_gm, attr, getattr(gm, attr))
    new_gm.recompile()
    return new_gm, [*example_inputs, *extra], tuple(extra)


def _linear_layout(store, names: dict):
    """`fuse_group_linears`' layout: a parameter placeholder's BF16 group (`store.linear_group`,
    made before the compile by `make_linear_groups`), as (key, position, members, first row,
    rows), else None."""

    def layout(node: fx.Node):
        g = store.linear_group(names.get(node))
        return None if g is None else (g.members, g.position, len(g.members), g.start, g.rows)

    return layout


def _fuse_groups(store, graph, extra, tensor_of, store_input, report) -> list[torch.Tensor]:
    """Run each fused group's GEMMs as one (`passes.fuse_group_gemms`), reading the group's
    buffers as new store placeholders; drop the store placeholders nothing reads any more.
    Returns the store tensors the graph now appends."""
    made: dict[tuple, tuple[fx.Node, fx.Node]] = {}

    def layout(codes: fx.Node):
        t = tensor_of.get(codes)
        g = store.group_layout(t) if t is not None else None
        return None if g is None else (g.members, g.position, len(g.members), g.start, g.rows)

    def buffers(members: tuple) -> tuple[fx.Node, fx.Node]:
        if members not in made:
            g = store.group_layout(store.entries[members[0]].codes)
            codes, scales = store_input(g.codes, "codes"), store_input(g.scales, "scales")
            # after the placeholders, found anew: the first op may be a member's scale view
            # that an earlier group's fusion erased
            first_op = next(n for n in graph.nodes if n.op != "placeholder")
            with graph.inserting_before(first_op):
                view = graph.call_function(torch.ops.aten.view.dtype, (scales, torch.uint8))
            view.meta["val"] = scales.meta["val"].view(torch.uint8)
            made[members] = (codes, view)
        return made[members]

    store.groups_fused += fuse_group_gemms(graph, layout, buffers, report)
    kept = []
    for t in extra:
        node = next(n for n, v in tensor_of.items() if v is t)
        if node.users:
            kept.append(t)
        else:
            graph.erase_node(node)
    return kept


def bind_module(store, module: fx.GraphModule) -> None:
    """Make an exported program's (unlifted) module read `store`: its weight quantizes
    become reads of the store's tensors, registered on the module as buffers (the same
    tensor objects, so `refresh` reaches them)."""
    graph = module.graph
    targets = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            t = _get_attr(module, node.target)
            targets[node] = store.param_name(t)
    sites = weight_quantize_sites(graph, targets.get)
    made: dict[tuple, tuple] = {}
    buffers: dict[int, str] = {}  # id(store tensor) -> its buffer name on the module

    def inputs(spec: QuantizeSpec, q: fx.Node):
        reads = site_reads(q)
        if (spec.name, reads) not in made:
            nodes = []
            for part, t in zip(PARTS, store.site_inputs(spec, q)):
                if t is None:
                    nodes.append(None)
                    continue
                if id(t) not in buffers:
                    buffers[id(t)] = f"minite_store_{len(buffers)}_{part}"
                    module.register_buffer(buffers[id(t)], t, persistent=False)
                with graph.inserting_before(q):
                    node = graph.get_attr(buffers[id(t)])
                node.meta["val"] = t
                nodes.append(node)
            made[spec.name, reads] = tuple(nodes)
        return made[spec.name, reads]

    store.sites_bound += bind_weight_inputs(graph, sites, inputs)
    graph.lint()
    module.recompile()


def _get_attr(module: torch.nn.Module, target: str):
    obj = module
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _hoist_placeholders(graph: fx.Graph) -> fx.Node:
    """Move every placeholder (in order) before the first other node (placeholders read
    nothing, so the order stays topological); returns the last placeholder."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for node in placeholders:
        first.prepend(node)
    return placeholders[-1]


def _copy_graph(graph: fx.Graph) -> tuple[fx.Graph, dict[fx.Node, fx.Node]]:
    new = fx.Graph()
    old_to_new: dict[fx.Node, fx.Node] = {}
    out, old_out = new.graph_copy(graph, old_to_new, return_output_node=True)
    new.output(out).meta.update(old_out.meta)
    for old, node in old_to_new.items():
        if old.op == "placeholder" and hasattr(old, "_dynamo_source"):
            node._dynamo_source = old._dynamo_source
    return new, old_to_new
