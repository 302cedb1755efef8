"""Rollout graphs read their weights' quantized bytes as inputs (not in PIPELINE: the rollout
engine's weight store runs it on its graphs after the pipeline, `rollout/weight_store.py`).

The lowering quantizes every NVFP4 weight inside the graph (`targets.emit_quantize_weight`:
detach -> fp4_compile::quantize, or a shared-scale group's weight_group_amax -> quantize): right
for the learner, whose weights change every step. A rollout graph runs once per generated token
with the same weights, so its engine quantizes each weight once per weight version, with the SAME
op and the same arguments (`quantize_spec` below), into stable buffers it owns; this pass makes
the graph read those buffers instead: every such quantize's codes, block scales and global
decode become the caller's input nodes (placeholders of a Dynamo graph, attributes of an
exported module), and the quantize, group amax and detach nodes go. An on-grid copy
(`quantize_with_ongrid`: the learner's weights on CUDA, whose forward and dgrad read it) becomes
the caller's on-grid input where the caller holds one (the learner's store: written once per
weight version, no decode per call), else `ongrid_weight` of the packed inputs (the same bits:
the on-grid values are exact decodes of the packed bytes). `site_reads` says which forms a site
reads. A quantize whose input is not a parameter stays in the graph.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen.nvfp4.op_args import QuantizeArg, QuantizeOut
from .graph_utils import erase_dead, insert_call


@dataclass(frozen=True)
class QuantizeSpec:
    """How the graph quantizes parameter `name`: `fp4_compile::quantize(w, block, global_scale,
    amax, rounding, seed)`, amax = `weight_group_amax` of the parameters `group` (in the graph's
    order) for global_scale "shared", else None."""

    name: str
    block: str
    global_scale: str
    rounding: str
    seed: int
    group: tuple[str, ...] = ()


@dataclass(frozen=True)
class SiteReads:
    """What the graph reads of one weight quantize site: `packed` its packed bytes (codes and
    block scales; False for a `quantize_with_ongrid` with packed=False, whose codes and scales
    are [..., N, 0]), `ongrid` its on-grid BF16 copy."""

    packed: bool
    ongrid: bool


def _ops():
    return torch.ops.fp4_compile


def _param(node, param_name: Callable[[fx.Node], str | None]) -> str | None:
    if isinstance(node, fx.Node) and node.op == "call_function":
        if node.target is not torch.ops.aten.detach.default:
            return None
        node = node.args[0]
    return param_name(node) if isinstance(node, fx.Node) else None


def weight_quantize_sites(
    graph: fx.Graph, param_name: Callable[[fx.Node], str | None]
) -> list[tuple[fx.Node, QuantizeSpec]]:
    """(quantize node, its spec) of every quantize of a parameter in `graph`. `param_name(node)`
    names the parameter a placeholder / get_attr node is, or None."""
    ops = _ops()
    out = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in (
            ops.quantize.default,
            ops.quantize_with_ongrid.default,
        ):
            continue
        name = _param(node.args[QuantizeArg.X], param_name)
        if name is None:
            continue
        amax = node.args[QuantizeArg.STATIC_AMAX]
        group: tuple[str, ...] = ()
        if amax is not None:
            if not (
                isinstance(amax, fx.Node)
                and amax.op == "call_function"
                and amax.target is ops.weight_group_amax.default
            ):
                continue  # a calibrated (static) amax: not a function of the weights alone
            group = tuple(_param(m, param_name) for m in amax.args[0])
            if None in group:
                continue
        a = node.args
        spec = QuantizeSpec(
            name=name,
            block=a[QuantizeArg.BLOCK],
            global_scale=a[QuantizeArg.GLOBAL_SCALE],
            rounding=a[QuantizeArg.ROUNDING],
            seed=a[QuantizeArg.SEED],
            group=group,
        )
        out.append((node, spec))
    return out


def site_reads(q: fx.Node) -> SiteReads:
    """The forms quantize node `q` (a site of `weight_quantize_sites`) gives its readers."""
    ops = _ops()
    if q.target is not ops.quantize_with_ongrid.default:
        return SiteReads(packed=True, ongrid=False)
    packed = len(q.args) <= QuantizeArg.PACKED or bool(q.args[QuantizeArg.PACKED])
    ongrid = any(u.args[1] == QuantizeOut.ONGRID for u in q.users)
    return SiteReads(packed=packed, ongrid=ongrid)


def bind_weight_inputs(
    graph: fx.Graph,
    sites: list[tuple[fx.Node, QuantizeSpec]],
    inputs: Callable[[QuantizeSpec, fx.Node], tuple[fx.Node, fx.Node, fx.Node, fx.Node | None]],
) -> int:
    """Replace each site's outputs with `inputs(spec, quantize_node)` = (codes, block scales,
    global decode, on-grid copy or None) nodes holding what the quantize computes (the codes
    and scales in the form `site_reads` names); a site's on-grid output becomes the on-grid
    node, or without one `ongrid_weight` of the packed nodes. Returns how many sites."""
    ops = _ops()
    dead = []
    for q, spec in sites:
        codes, scales, gd, ongrid = inputs(spec, q)
        for item in list(q.users):
            assert item.op == "call_function" and item.target is operator.getitem, item
            index = item.args[1]
            if index == QuantizeOut.ONGRID and ongrid is not None:
                repl = ongrid
            elif index == QuantizeOut.ONGRID:
                view = insert_call(
                    graph, torch.ops.aten.view.dtype, (scales, torch.uint8), before=item, like=q
                )
                repl = insert_call(
                    graph, ops.ongrid_weight.default, (codes, view), before=item, like=q
                )
            else:
                repl = (codes, scales, gd)[index]
            item.replace_all_uses_with(repl)
            dead.append(item)
        dead.append(q)
        dead.extend(n for n in q.all_input_nodes if n.op == "call_function")
        amax = q.args[QuantizeArg.STATIC_AMAX]
        if isinstance(amax, fx.Node):
            dead.extend(n for n in amax.all_input_nodes if n.op == "call_function")
    erase_dead(graph, dead)
    return len(sites)
