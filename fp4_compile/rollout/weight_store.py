"""The rollout engine's quantized weights: an explicit store its graphs take as inputs.

The lowering quantizes every NVFP4 weight inside the graph, right for the learner (new weights
every step) but, for a rollout, a re-quantize of every weight for every generated token. The
engine's graphs therefore read each weight's quantized bytes (codes, E4M3 block scales, global
decode) from this store instead (`passes/bind_weight_inputs.py`): one entry per parameter the
lowering quantizes, a set of tensors allocated once, at the graph's first compile, and rewritten
IN PLACE by `refresh` (at load and at every `update_weights`). Their addresses never change, so
a captured CUDA graph sees the new bytes, and there is no cache to invalidate: what a graph reads
is what the last `refresh` wrote, computed from the parameters by the learner's own quantizer
(the same `fp4_compile::quantize` / `weight_group_amax` op with the same arguments the learner's
graph runs), so the same bytes.

Shape legend: N out-features, K in-features, E experts.
"""

from __future__ import annotations

import weakref

import torch
import torch.fx as fx

from ..passes import QuantizeSpec, bind_weight_inputs, weight_quantize_sites


def _ops():
    from .. import codegen  # noqa: F401  (registers the fp4_compile ops)

    return torch.ops.fp4_compile


# on_change stores, told of every optimizer step: a fused optimizer (torch's AdamW(fused=True))
# writes the parameters without bumping their version counters, so versions alone miss it
_ON_CHANGE_STORES: weakref.WeakSet = weakref.WeakSet()
_optimizer_hook = None


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for store in list(_ON_CHANGE_STORES):
        if stepped & store._param_ids:
            store._stepped = True


def _watch_optimizer_steps(store: WeightStore) -> None:
    global _optimizer_hook
    if _optimizer_hook is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _optimizer_hook = register_optimizer_step_post_hook(_after_optimizer_step)
    _ON_CHANGE_STORES.add(store)


class WeightStore:
    """params: name -> the engine's own parameter tensors (read at every `refresh`).

    on_change=False (the rollout engine): the owner calls `refresh` when the weights change.
    on_change=True (the learner, `fp4_compile.compile(..., quantize_weights="on_change")`): the
    compiled function calls `refresh_if_changed` before every call, which re-quantizes when a
    parameter the store reads was written since the last refresh: by any `torch.optim`
    optimizer's step over it (a global step hook: fused optimizers bump no version counter),
    or in place otherwise (`load_state_dict`, a manual edit: each bumps the tensor's version
    counter). Micro-batches of one optimizer step then never re-quantize."""

    def __init__(self, params: dict[str, torch.Tensor], *, on_change: bool = False,
                 model: torch.nn.Module | None = None):  # fmt: skip
        self.params = dict(params)
        self.on_change = on_change
        self._model = model  # on_change: checked for replaced parameters before every call
        self._names = {id(p): n for n, p in self.params.items()}
        self.specs: dict[str, QuantizeSpec] = {}
        self.tensors: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._seen: dict[str, int] = {}  # parameter name -> its version at the last quantize
        self._param_ids = {id(p) for p in self.params.values()}
        self._stepped = False  # an optimizer stepped over these parameters since the refresh
        self.refreshes = 0
        self.sites_bound = 0
        if on_change:
            _watch_optimizer_steps(self)

    @classmethod
    def for_learner(cls, model: torch.nn.Module) -> WeightStore:
        """The learner's store of `model` (on_change, checked for replaced parameters):
        `fp4_compile.compile(..., quantize_weights="on_change")` passes it to the backend."""
        return cls(dict(model.named_parameters()), on_change=True, model=model)

    # ---- filling -----------------------------------------------------------------------------
    @torch.no_grad()
    def _quantize(self, spec: QuantizeSpec, amaxes: dict) -> tuple[torch.Tensor, ...]:
        ops = _ops()
        amax = None
        if spec.group:
            if spec.group not in amaxes:
                members = [self.params[m].detach() for m in spec.group]
                amaxes[spec.group] = ops.weight_group_amax.default(members)
            amax = amaxes[spec.group]
        w = self.params[spec.name].detach()
        return ops.quantize.default(
            w, spec.block, spec.global_scale, amax, spec.rounding, spec.seed
        )

    def _require(self, spec: QuantizeSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The entry of `spec`'s parameter, created (quantized now) on first use."""
        known = self.specs.get(spec.name)
        if known is not None:
            if known != spec:
                raise ValueError(
                    f"parameter {spec.name!r} is quantized as {known} in one rollout graph and "
                    f"as {spec} in another: one weight store entry cannot serve both"
                )
            return self.tensors[spec.name]
        self.specs[spec.name] = spec
        self.tensors[spec.name] = tuple(self._quantize(spec, {}))
        for name in (spec.name, *(spec.group or ())):
            self._seen[name] = self.params[name]._version
        return self.tensors[spec.name]

    @torch.no_grad()
    def refresh(self) -> None:
        """Re-quantize every entry from the parameters, written in place (stable addresses)."""
        amaxes: dict = {}
        for name, spec in self.specs.items():
            new = self._quantize(spec, amaxes)
            for mine, fresh in zip(self.tensors[name], new):
                mine.copy_(fresh)
        self._seen = {name: self.params[name]._version for name in self._seen}
        self._stepped = False
        self.refreshes += 1

    def changed(self) -> list[str]:
        """The parameters the store reads that were written since their last quantize (all of
        them after an optimizer step over any)."""
        if self._stepped:
            return list(self._seen)
        return [n for n, v in self._seen.items() if self.params[n]._version != v]

    def refresh_if_changed(self) -> bool:
        """`refresh` when any parameter the store reads changed (see the class docstring)."""
        if self._model is not None:
            self.check_unmoved(self._model)
        if not self.changed():
            return False
        self.refresh()
        return True

    def check_unmoved(self, model: torch.nn.Module) -> None:
        """Refuse parameters replaced by new tensors since the engine was built: the store and
        the compiled / captured graphs hold the old ones (update weights in place instead)."""
        for name, p in model.named_parameters():
            if self.params.get(name) is not p:
                raise ValueError(
                    f"parameter {name!r} of the model is no longer the tensor its weight store was "
                    "built with (replaced, e.g. load_state_dict(assign=True)): update the weights "
                    "in place (a rollout engine: update_weights), or compile / build anew"
                )

    # ---- binding graphs ----------------------------------------------------------------------
    def bind_dynamo_graph(self, gm: fx.GraphModule, example_inputs: list):
        """A copy of Dynamo graph `gm` whose weight quantizes read this store (new trailing
        placeholders), its example inputs, and the store tensors to append to every call.
        (Dynamo keeps reading its own graph's placeholders after the backend returns: the
        placeholders go into a copy.)"""
        from torch._guards import detect_fake_mode

        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        names = {n: self._names.get(id(x)) for n, x in zip(placeholders, example_inputs)}
        graph, old_to_new = _copy_graph(gm.graph)
        new_names = {old_to_new[n]: v for n, v in names.items() if v is not None}
        sites = weight_quantize_sites(graph, new_names.get)
        if not sites:
            return gm, list(example_inputs), ()
        fake_mode = detect_fake_mode(example_inputs)
        anchor = _hoist_placeholders(graph)
        extra: list[torch.Tensor] = []
        made: dict[str, tuple[fx.Node, ...]] = {}

        def inputs(spec: QuantizeSpec, q: fx.Node):
            nonlocal anchor
            if spec.name not in made:
                nodes = []
                for part, t in zip(("codes", "scales", "global_decode"), self._require(spec)):
                    with graph.inserting_after(anchor):
                        anchor = graph.placeholder(f"minite_store_{len(extra)}_{part}")
                    anchor._dynamo_source = None  # not a user input: the backend appends it
                    val = fake_mode.from_tensor(t, static_shapes=True) if fake_mode else t
                    anchor.meta["val"] = anchor.meta["example_value"] = val
                    extra.append(t)
                    nodes.append(anchor)
                made[spec.name] = tuple(nodes)
            return made[spec.name]

        self.sites_bound += bind_weight_inputs(graph, sites, inputs)
        graph.lint()
        new_gm = fx.GraphModule(gm, graph)
        new_gm.meta.update(gm.meta)
        for attr in ("_param_name_to_source", "shape_env"):
            if hasattr(gm, attr):
                setattr(new_gm, attr, getattr(gm, attr))
        new_gm.recompile()
        return new_gm, [*example_inputs, *extra], tuple(extra)

    def bind_module(self, module: fx.GraphModule) -> None:
        """Make an exported program's (unlifted) module read this store: its weight quantizes
        become reads of the store's tensors, registered on the module as buffers (the same
        tensor objects, so `refresh` reaches them)."""
        graph = module.graph
        targets = {}
        for node in graph.nodes:
            if node.op == "get_attr":
                t = _get_attr(module, node.target)
                targets[node] = self._names.get(id(t)) if isinstance(t, torch.Tensor) else None
        sites = weight_quantize_sites(graph, targets.get)
        made: dict[str, tuple[fx.Node, ...]] = {}

        def inputs(spec: QuantizeSpec, q: fx.Node):
            if spec.name not in made:
                nodes = []
                for part, t in zip(("codes", "scales", "global_decode"), self._require(spec)):
                    attr = f"minite_store_{len(made)}_{part}"
                    module.register_buffer(attr, t, persistent=False)
                    with graph.inserting_before(q):
                        node = graph.get_attr(attr)
                    node.meta["val"] = t
                    nodes.append(node)
                made[spec.name] = tuple(nodes)
            return made[spec.name]

        self.sites_bound += bind_weight_inputs(graph, sites, inputs)
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
