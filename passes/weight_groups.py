"""Weight groups that share one global scale (`NVFP4Recipe.shared_weight_scale`): the linears an
inference engine fuses into one layer and gives ONE weight global scale (vLLM's
QKVParallelLinear and MergedColumnParallelLinear): q/k/v of one attention, gate/up of one MLP.

The lowering (learner and rollout graphs alike) and the checkpoint export form the groups with
the same function from module paths, so the exported bytes are the learner's bytes. Only the
members the recipe quantizes count; a group needs at least two of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..recipe import NVFP4Recipe

FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fused_group(path: str) -> str | None:
    """The fused group a module path belongs to, named by its parent and the group's leaves
    ("model.layers.0.self_attn.{q_proj,k_proj,v_proj}"), or None."""
    parent, _, leaf = path.rpartition(".")
    for group in FUSED_GROUPS:
        if leaf in group:
            return f"{parent}.{{{','.join(group)}}}" if parent else f"{{{','.join(group)}}}"
    return None


def _leaf_rank(path: str) -> int:
    leaf = path.rpartition(".")[2]
    return next(g.index(leaf) for g in FUSED_GROUPS if leaf in g)


def shared_scale_groups(nvfp4_paths: Iterable[str], recipe: NVFP4Recipe) -> dict[str, list[str]]:
    """{group name: its member paths in group order (q, k, v / gate, up)} over the module paths
    the recipe quantizes to NVFP4, for every group with at least two of them; {} when the
    recipe's `shared_weight_scale` is off."""
    if not recipe.shared_weight_scale:
        return {}
    groups: dict[str, set[str]] = {}
    for path in nvfp4_paths:
        name = fused_group(path)
        if name is not None:
            groups.setdefault(name, set()).add(path)
    return {
        name: sorted(members, key=_leaf_rank)
        for name, members in sorted(groups.items())
        if len(members) > 1
    }
