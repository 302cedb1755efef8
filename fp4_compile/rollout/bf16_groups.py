"""A weight store's BF16 group buffers: the weights of a fused group that the graphs read
unquantized (every linear of a recipe with quantize=False) as row ranges of ONE tensor, so an
inference graph runs the group's linears as one (`passes/fuse_group_linears.py`).

The group (`weight_policy.FUSED_GROUPS`: q/k/v of one attention, gate/up of one MLP) is laid out
as one buffer [N_total, K], the members in group order, and the members' parameters are
re-pointed to their row ranges of it (`p.data = buffer[start:end]`: the same Parameter objects,
shapes, strides, dtype and values; each range is contiguous). So the weights are held once, not
twice: the parameters ARE the buffer. Whatever writes the parameters in place (the engine's
`update_weights` copying the learner's tensors, an optimizer step on a module the engine shares)
writes the buffer the graphs read: nothing to rewrite, no copy to keep in sync.

Made by `WeightStore.make_linear_groups`, which a rollout engine of a recipe with quantize=False
calls at construction, before anything is compiled (Dynamo must trace the parameters where they
then lie: re-pointing them under a compile breaks its recorded storage offsets); the graphs
bound to the store with no gradient then fuse the group's linears (`store_binding.py`). Left as
they are (the linears not fused), by what can be seen: members that are not all parameters of the store, not 2-D, of
different K, dtype or device, not contiguous, sharing their storage with another tensor (a tied
weight), released (`weights="packed"`), or that look like a learner's (a gradient, or a learner's
weight store reads them: the learner's compiled graphs may hold their addresses).

Shape legend: N out-features, K in-features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..weight_policy import FUSED_GROUPS


@dataclass(frozen=True)
class LinearGroup:
    """Where a member's weight lies in its group's buffer [N_total, K]: `members` (parameter
    names in buffer order), its position there, its first row and row count."""

    members: tuple[str, ...]
    position: int
    start: int
    rows: int
    buffer: torch.Tensor


def group_members(name: str, params: dict[str, torch.Tensor]) -> tuple[str, ...] | None:
    """The parameter names of `name`'s fused group in group order ("...q_proj.weight" ->
    q/k/v's weights), or None (not a group member's weight, or a member missing)."""
    path, _, leaf_attr = name.rpartition(".")
    if leaf_attr != "weight":
        return None
    parent, _, leaf = path.rpartition(".")
    prefix = f"{parent}." if parent else ""
    for group in FUSED_GROUPS:
        if leaf in group:
            members = tuple(f"{prefix}{m}.weight" for m in group)
            return members if all(m in params for m in members) else None
    return None


def _own_storage(p: torch.Tensor) -> bool:
    return p.storage_offset() == 0 and p.untyped_storage().nbytes() == p.numel() * p.element_size()


def _storage_id(t: torch.Tensor) -> int:
    """The storage's identity (its data pointer is 0 for every meta tensor)."""
    return t.untyped_storage()._cdata


def _laid_out(ws: list[torch.Tensor]) -> bool:
    """Whether `ws` already are consecutive row ranges of one storage that holds them alone
    (a group made by an earlier store over the same parameters)."""
    w0, offset = ws[0], 0
    for w in ws:
        if _storage_id(w) != _storage_id(w0):
            return False
        if w.storage_offset() != offset:
            return False
        offset += w.numel()
    return w0.untyped_storage().nbytes() == offset * w0.element_size()


def groupable(ws: list[torch.Tensor], looks_like_learner) -> bool:
    """Whether the parameters `ws` (one group, in order) can be re-pointed into one buffer
    (see the module docstring)."""
    w0 = ws[0]
    return (
        not looks_like_learner(ws)
        and all(
            w.dim() == 2
            and w.shape[1] == w0.shape[1]
            and w.dtype == w0.dtype
            and w.device == w0.device
            and w.is_contiguous()
            and w.numel() > 0
            for w in ws
        )
        and (all(_own_storage(w) for w in ws) or _laid_out(ws))
        and len({id(w) for w in ws}) == len(ws)
    )


@torch.no_grad()
def make_group(params: dict[str, torch.Tensor], members: tuple[str, ...]) -> list[LinearGroup]:
    """One buffer holding the members' weights in order, each member's parameter re-pointed to
    its rows; the members' layouts, in order."""
    ws = [params[m] for m in members]
    laid_out = _laid_out(ws)
    if laid_out:  # the buffer an earlier store made: its storage, viewed whole
        rows = sum(w.shape[0] for w in ws)
        buffer = (
            ws[0].detach().new_empty(0).set_(ws[0].untyped_storage(), 0, (rows, ws[0].shape[1]))
        )
    else:
        buffer = torch.cat([w.detach() for w in ws])
    out, start = [], 0
    for pos, w in enumerate(ws):
        n = w.shape[0]
        if not laid_out:
            w.data = buffer[start : start + n]
        out.append(LinearGroup(members, pos, start, n, buffer))
        start += n
    return out


def make_linear_groups(store, looks_like_learner) -> int:
    """Lay out every fused group of `store`'s parameters whose weights the graphs will read in
    BF16 (a rollout engine of a recipe with quantize=False: called before the first compile)
    as one buffer, its members re-pointed into it, recorded in `store.linear_groups`; how many
    groups were made. A fuse_groups store only; members with store entries (quantized) and
    groups refused by `groupable` stay as they are."""
    made = 0
    for name in list(store.params) if store.fuse_groups else ():
        members = group_members(name, store.params)
        if members is None or name != members[0] or name in store.linear_groups:
            continue
        if any(m in store.entries for m in members):
            continue
        if not groupable([store.params[m] for m in members], looks_like_learner):
            continue
        for g in make_group(store.params, members):
            store.linear_groups[g.members[g.position]] = g
        made += 1
    return made
