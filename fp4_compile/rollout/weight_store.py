"""Quantized weights as graph inputs: an explicit store, for the rollout engine and the learner.

The lowering quantizes every NVFP4 weight inside the graph, right for a learner that wants new
weights every call but, for a rollout, a re-quantize of every weight for every generated token,
and for a learner a re-quantize per micro-batch of weights that change once per optimizer step.
A graph bound to a store reads each weight's quantized forms from it instead
(`passes/bind_weight_inputs.py`): one entry per parameter the lowering quantizes, a set of
tensors allocated once, at the first compile that reads them, and rewritten IN PLACE. Their
addresses never change, so a captured CUDA graph sees the new bytes (the graph inputs are
marked static: CUDA-graph replays read them where they are, no copy), and there is no cache to
invalidate: what a graph reads is what the last write wrote, computed from the parameters by
the learner's own quantizer (the implementation of the `fp4_compile::quantize` /
`quantize_with_ongrid` / `weight_group_amax` ops, with the arguments the graph's node had:
`codegen.quantize_into`), so the same bytes.

What an entry holds is what the bound graphs read (`passes.site_reads`): the packed bytes
(codes, E4M3 block scales) and the global decode; and, in a store made with hold_ongrid (the
learner's), the on-grid BF16 copy where the lowering gave the weight one (CUDA, a forward of
>= `codegen.nvfp4.gemm.ONGRID_FORWARD_MIN_ROWS` rows per weight: `gemm.forward_uses_ongrid`,
decided by the lowering, not here), which the forward and the dgrad then read with no decode per
call. A weight all of whose GEMMs read the copy (`passes/skip_unread_packed_weights.py`) gets
no packed bytes written at all. The rollout engine's store holds no on-grid copy (its memory
goes to the KV cache; a prefill that reads one decodes it per call).

When an entry is rewritten:
- on_change=False (the rollout engine): `refresh`, called by the owner (load, `update_weights`).
- on_change=True (the learner: `fp4_compile.compile(..., quantize_weights="on_change")`): before
  every call of a bound graph, `refresh_if_changed` rewrites the entries whose parameters were
  written since their last write: by a `torch.optim` optimizer's step over them (a global
  step post-hook marks them; torch's fused AdamW bumps no version counter), or in place
  otherwise (`load_state_dict`, a manual edit: each bumps the tensor's version counter). So the
  micro-batches of one optimizer step share one quantize (the first call after the step does
  it), several optimizers' steps coalesce into one refresh, and a step with no call after it
  costs nothing. The refresh shows in profiles as `minite::weight_store_refresh`. One write
  per entry: the group amax (once per shared-scale group), then one quantize whose kernels
  write the entry's tensors in place (a weight's 16x16 RNE quantize: one launch,
  `weight_quantize_kernel.py`, where `configs.LAUNCH` takes it; the global decode, a few bytes,
  is copied).
Fused groups (a store with fuse_groups, the default of the rollout engines' stores): the members
of a shared-scale group (q/k/v, gate/up: `QuantizeSpec.group`) that hold packed bytes only are
made together, as row ranges of ONE codes buffer [N_total, K/2] and ONE scale buffer
[N_total, K/16] in group order (`group_layout`), so an inference graph can run their GEMMs as
one (`passes/fuse_group_gemms.py`); each member's entry holds views of them, rewritten in place
as any entry. Members of different K, dtype or device, or that a graph reads on-grid, are made
one by one (and not fused). The groups the graphs read in BF16 (a recipe with quantize=False) have
no entries: their parameters are re-pointed into one buffer per group (`linear_group`,
`bf16_groups.py`), which the inference graphs' one linear per group reads.
Cost: a learner's store keeps the on-grid copy of each such weight between steps (the
every-call learner keeps it from the forward to the backward only).

Shape legend: N out-features, K in-features, E experts.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.fx as fx
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen import quantize_into
from ..passes import QuantizeSpec, SiteReads, site_reads
from .bf16_groups import LinearGroup, make_linear_groups
from .store_binding import bind_dynamo_graph, bind_module


def _ops():
    return torch.ops.fp4_compile


def released_storage(t: torch.Tensor) -> bool:
    """Whether `t` keeps its shape but no longer its values: its storage was resized to 0
    (`untyped_storage().resize_(0)`, as RolloutEngine(weights="packed") and FSDP do)."""
    return t.numel() > 0 and t.untyped_storage().nbytes() == 0


# on_change stores, told of every optimizer step: a fused optimizer (torch's AdamW(fused=True))
# writes the parameters without bumping their version counters, so versions alone miss it
_ON_CHANGE_STORES: weakref.WeakSet = weakref.WeakSet()
_optimizer_hook = None


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for store in list(_ON_CHANGE_STORES):
        for entry in store.entries.values():
            if not entry.stepped and stepped & entry.param_ids:
                entry.stepped = True


def in_learner_store(params) -> bool:
    """Whether a live on_change store (a learner's) reads any of the tensors `params`."""
    ids = {id(p) for p in params}
    return any(ids & {id(p) for p in s.params.values()} for s in list(_ON_CHANGE_STORES))


def _looks_like_learner(params) -> bool:
    """A gradient on one of `params`, or a learner's weight store reads one."""
    return any(p.grad is not None for p in params) or in_learner_store(params)


def _watch_optimizer_steps(store: WeightStore) -> None:
    global _optimizer_hook
    if _optimizer_hook is None:
        _optimizer_hook = register_optimizer_step_post_hook(_after_optimizer_step)
    _ON_CHANGE_STORES.add(store)


@dataclass(frozen=True)
class GroupLayout:
    """Where a fused group member's packed rows lie: `members` (the group, in buffer order),
    its position there, its first row and row count in the buffers `codes` [N_total, K/2] and
    `scales` [N_total, K/16] (E4M3)."""

    members: tuple[str, ...]
    position: int
    start: int
    rows: int
    codes: torch.Tensor
    scales: torch.Tensor


@dataclass
class StoreEntry:
    """One parameter's quantized forms. codes / scales: packed bytes, or [..., N, 0] when no
    bound graph reads them; ongrid: the on-grid BF16 copy, or None; `empty`: the [..., N, 0]
    pair handed to graphs that read no packed bytes while the entry holds them."""

    spec: QuantizeSpec
    codes: torch.Tensor
    scales: torch.Tensor
    global_decode: torch.Tensor
    ongrid: torch.Tensor | None
    param_ids: set[int]
    seen: dict[str, int] = field(default_factory=dict)  # parameter -> version at the last write
    stepped: bool = False  # an optimizer stepped over one of its parameters since
    empty: tuple[torch.Tensor, torch.Tensor] | None = None
    group_layout: GroupLayout | None = None  # a fused group's member: its rows of the buffers

    @property
    def packed(self) -> bool:
        return self.codes.shape[-1] > 0


class WeightStore:
    """params: name -> the owner's own parameter tensors (read at every write). hold_ongrid
    (default: on_change): keep the on-grid copies the bound graphs read. fuse_groups (default:
    not on_change, the rollout engines' stores): lay shared-scale groups out as one buffer and
    fuse their GEMMs in the graphs bound with no gradient. See the module docstring for when
    entries are rewritten."""

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        *,
        on_change: bool = False,
        model: torch.nn.Module | None = None,
        hold_ongrid: bool | None = None,
        fuse_groups: bool | None = None,
    ):
        self.params = dict(params)
        self.on_change = on_change
        self.hold_ongrid = on_change if hold_ongrid is None else hold_ongrid
        self.fuse_groups = (not on_change) if fuse_groups is None else fuse_groups
        self._model = model  # on_change: checked for replaced parameters before every call
        self._names = {id(p): n for n, p in self.params.items()}
        self.entries: dict[str, StoreEntry] = {}
        self.refreshes = 0  # refresh calls that wrote entries
        self.entry_writes = 0  # entries written, creation included
        self.sites_bound = 0
        self.groups_fused = 0  # group GEMMs run as one, over the graphs bound so far
        self.linear_groups: dict[str, LinearGroup] = {}  # BF16 group buffers (`bf16_groups.py`)
        self._refresh_graph = None  # CUDA: every entry's write, captured once (`_refresh`)
        self._source = None  # name -> tensor, read instead of the parameters (`refresh`)
        if on_change:
            _watch_optimizer_steps(self)

    @classmethod
    def for_learner(cls, model: torch.nn.Module) -> WeightStore:
        """The learner's store of `model` (on_change, on-grid copies held, checked for
        replaced parameters): `fp4_compile.compile(..., quantize_weights="on_change")`."""
        return cls(dict(model.named_parameters()), on_change=True, model=model)

    @property
    def specs(self) -> dict[str, QuantizeSpec]:
        return {name: e.spec for name, e in self.entries.items()}

    @property
    def tensors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """name -> (codes, block scales, global decode) of every entry."""
        return {n: (e.codes, e.scales, e.global_decode) for n, e in self.entries.items()}

    # ---- filling -----------------------------------------------------------------------------
    def _read(self, name: str) -> torch.Tensor:
        """The values a write quantizes: `source(name)` during `refresh(source=...)`, else the
        parameter, refused by name where its storage was released (`released_storage`)."""
        if self._source is not None:
            return self._source(name)
        p = self.params[name]
        if released_storage(p):
            raise ValueError(
                f"parameter {name!r} no longer holds its values (its storage was released: "
                "RolloutEngine(weights='packed')); the store can only be written from another "
                "source (refresh(source=...), the engine's update_weights)"
            )
        return p.detach()

    def _amax(self, spec: QuantizeSpec, amaxes: dict) -> torch.Tensor | None:
        if not spec.group:
            return None
        if spec.group not in amaxes:
            members = [self._read(m) for m in spec.group]
            amaxes[spec.group] = _ops().weight_group_amax.default(members)
        return amaxes[spec.group]

    def _quantize(self, spec: QuantizeSpec, amaxes: dict, *, packed: bool, ongrid: bool):
        """New tensors: the op the graph ran, with its arguments."""
        ops, w = _ops(), self._read(spec.name)
        args = (
            w,
            spec.block,
            spec.global_scale,
            self._amax(spec, amaxes),
            spec.rounding,
            spec.seed,
        )
        if ongrid:
            return ops.quantize_with_ongrid.default(*args, packed)
        return (*ops.quantize.default(*args), None)

    @torch.no_grad()
    def _write(self, entry: StoreEntry, amaxes: dict) -> None:
        """Rewrite `entry` in place from the parameters."""
        spec = entry.spec
        quantize_into(
            self._read(spec.name),
            spec.block,
            spec.global_scale,
            self._amax(spec, amaxes),
            spec.rounding,
            spec.seed,
            codes=entry.codes,
            scales=entry.scales,
            global_decode=entry.global_decode,
            ongrid=entry.ongrid,
        )
        self._mark_written(entry)

    def _mark_written(self, entry: StoreEntry) -> None:
        entry.seen = {n: self.params[n]._version for n in (entry.spec.name, *entry.spec.group)}
        entry.stepped = False
        self.entry_writes += 1

    def _require(self, spec: QuantizeSpec, reads: SiteReads):
        """(codes, block scales, global decode, on-grid copy or None) of `spec`'s parameter in
        the forms a site reading `reads` needs; the entry is created, or grown by a form it
        lacks (quantized now, its existing tensors rewritten in place), on first need."""
        want_packed = reads.packed or not self.hold_ongrid
        want_ongrid = reads.ongrid and self.hold_ongrid
        entry = self.entries.get(spec.name)
        if entry is not None and entry.spec != spec:
            raise ValueError(
                f"parameter {spec.name!r} is quantized as {entry.spec} in one graph and as "
                f"{spec} in another: one weight store entry cannot serve both"
            )
        if entry is None and self._groupable(spec, want_packed, want_ongrid):
            entry = self._create_group(spec)
        if (
            entry is None
            or (want_packed and not entry.packed)
            or (want_ongrid and entry.ongrid is None)
        ):
            entry = self._create_or_grow(spec, entry, want_packed, want_ongrid)
        codes, scales = entry.codes, entry.scales
        if not want_packed and entry.packed:
            if entry.empty is None:
                lead = entry.codes.shape[:-1]
                entry.empty = (codes.new_empty((*lead, 0)), scales.new_empty((*lead, 0)))
            codes, scales = entry.empty
        return codes, scales, entry.global_decode, entry.ongrid if want_ongrid else None

    def _create_or_grow(self, spec, entry, want_packed: bool, want_ongrid: bool) -> StoreEntry:
        packed = want_packed or (entry is not None and entry.packed)
        ongrid = want_ongrid or (entry is not None and entry.ongrid is not None)
        codes, scales, gd, copy = self._quantize(spec, {}, packed=packed, ongrid=ongrid)
        self._refresh_graph = None  # the entries change: capture anew
        if entry is None:
            ids = {id(self.params[n]) for n in (spec.name, *spec.group)}
            entry = StoreEntry(spec, codes, scales, gd, copy, ids)
            self.entries[spec.name] = entry
        else:  # bound graphs hold the existing tensors: rewrite them, adopt the new forms
            entry.global_decode.copy_(gd)
            if entry.packed:
                entry.codes.copy_(codes)
                entry.scales.copy_(scales)
            else:
                entry.codes, entry.scales = codes, scales
            if entry.ongrid is not None:
                entry.ongrid.copy_(copy)
            else:
                entry.ongrid = copy
        self._mark_written(entry)
        return entry

    def _groupable(self, spec: QuantizeSpec, want_packed: bool, want_ongrid: bool) -> bool:
        """Whether `spec`'s group is made as one buffer (see the module docstring)."""
        group = spec.group
        if not (self.fuse_groups and len(group) > 1 and spec.name in group):
            return False
        if not want_packed or want_ongrid or any(m in self.entries for m in group):
            return False
        ws = [self.params[m] for m in group]
        return all(
            w.dim() == 2
            and w.shape[1] == ws[0].shape[1]
            and w.dtype == ws[0].dtype
            and w.device == ws[0].device
            for w in ws
        )

    def _create_group(self, spec: QuantizeSpec) -> StoreEntry:
        """Every member of `spec`'s group, quantized (the op the graph runs, with each member's
        arguments) into row ranges of one codes and one scale buffer; returns `spec`'s entry."""
        specs = [replace(spec, name=m) for m in spec.group]
        amaxes: dict = {}
        outs = [self._quantize(s, amaxes, packed=True, ongrid=False) for s in specs]
        codes = torch.cat([o[0] for o in outs])
        scale_dtype = outs[0][1].dtype
        scales = torch.cat([o[1].view(torch.uint8) for o in outs]).view(scale_dtype)
        self._refresh_graph = None  # the entries change: capture anew
        ids = {id(self.params[n]) for n in spec.group}
        start = 0
        for pos, (s, (c, _, gd, _)) in enumerate(zip(specs, outs)):
            n = c.shape[0]
            layout = GroupLayout(spec.group, pos, start, n, codes, scales)
            entry = StoreEntry(
                s, codes[start : start + n], scales[start : start + n], gd, None, set(ids)
            )
            entry.group_layout = layout
            self.entries[s.name] = entry
            self._mark_written(entry)
            start += n
        return self.entries[spec.name]

    def group_layout(self, codes: torch.Tensor) -> GroupLayout | None:
        """The fused-group layout of the entry whose packed codes are the tensor `codes` (the
        object a bound graph reads), or None (not a fused group's member)."""
        for entry in self.entries.values():
            if entry.codes is codes:
                return entry.group_layout
        return None

    def make_linear_groups(self) -> int:
        """Lay out the fused groups the graphs will read in BF16 as one buffer each, their
        parameters re-pointed into it (`bf16_groups.make_linear_groups`); how many were made."""
        return make_linear_groups(self, _looks_like_learner)

    def linear_group(self, name: str | None) -> LinearGroup | None:
        """Where parameter `name`'s BF16 weight lies in its group's buffer (`make_linear_groups`),
        or None."""
        return self.linear_groups.get(name) if self.fuse_groups else None

    @torch.no_grad()
    def refresh(self, source: Callable[[str], torch.Tensor] | None = None) -> None:
        """Rewrite every entry from the parameters, in place (stable addresses). source: name
        -> the tensor to quantize instead of the store's parameter (on the store's device, the
        parameter's shape and dtype), read one entry (and its group's members) at a time: how
        an engine that released its parameters' storage takes a learner's weights."""
        self._source = source
        try:
            self._refresh(list(self.entries.values()))
        finally:
            self._source = None

    def _refresh(self, entries: list[StoreEntry]) -> None:
        """Write `entries`. An on_change store on CUDA that rewrites every entry replays one
        CUDA graph of all the writes (captured at the first such refresh, after a warm-up write
        on a side stream): the same kernels with the same arguments, so the same bytes, in one
        launch instead of a few per weight, none of them waiting on Python. The parameters
        and the entries keep their addresses (`check_unmoved`; a grown entry drops the graph)."""
        with torch.profiler.record_function("minite::weight_store_refresh"):
            if self._graphable(entries):
                self._graph_refresh()
            else:
                self._write_all(entries)
        self.refreshes += 1

    def _write_all(self, entries: list[StoreEntry]) -> None:
        amaxes: dict = {}  # a group's amax, computed once for its members
        for entry in entries:
            self._write(entry, amaxes)

    def _graphable(self, entries: list[StoreEntry]) -> bool:
        return (
            self.on_change
            and self._source is None
            and len(entries) == len(self.entries) > 0
            and all(p.is_cuda for p in self.params.values())
        )

    def _graph_refresh(self) -> None:
        entries = list(self.entries.values())
        if self._refresh_graph is not None:
            self._refresh_graph.replay()
            for entry in entries:
                self._mark_written(entry)
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the warm-up: this refresh's writes (and kernel compiles)
            self._write_all(entries)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        writes = self.entry_writes
        with torch.cuda.graph(graph):  # captured, not run: the warm-up wrote the same bytes
            self._write_all(entries)
        self.entry_writes = writes  # the capture wrote nothing
        self._refresh_graph = graph

    def _stale(self) -> list[StoreEntry]:
        return [
            e
            for e in self.entries.values()
            if e.stepped or any(self.params[n]._version != v for n, v in e.seen.items())
        ]

    def changed(self) -> list[str]:
        """The parameters whose entries are stale: written since the entry's last write (by an
        optimizer step over any of its parameters, or in place)."""
        return [e.spec.name for e in self._stale()]

    def refresh_if_changed(self) -> bool:
        """Rewrite the stale entries (see the module docstring); whether any was."""
        if self._model is not None:
            self.check_unmoved(self._model)
        stale = self._stale()
        if not stale:
            return False
        self._refresh(stale)
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

    # ---- binding graphs (`store_binding.py`) -------------------------------------------------
    def bind_dynamo_graph(self, gm: fx.GraphModule, example_inputs: list, report=None):
        """A copy of Dynamo graph `gm` whose weight quantizes read this store, its example
        inputs, and the store tensors to append to every call (`store_binding.py`); `report`
        (a `LoweringReport`) gets the group GEMM fusion's counts and notes."""
        return bind_dynamo_graph(self, gm, example_inputs, report)

    def bind_module(self, module: fx.GraphModule) -> None:
        """Make an exported program's (unlifted) module read this store (`store_binding.py`)."""
        bind_module(self, module)

    def param_name(self, t) -> str | None:
        """The name of the store's parameter tensor `t` (the object itself), else None."""
        return self._names.get(id(t)) if isinstance(t, torch.Tensor) else None

    def site_inputs(self, spec: QuantizeSpec, q: fx.Node):
        """(codes, block scales, global decode, on-grid copy or None) for quantize site q of
        `spec`'s parameter, in the forms the site reads (`passes.site_reads`)."""
        return self._require(spec, site_reads(q))
