"""The learner's weight store in the learner cost model (`fp4_compile/cost/learner.py`):
`fp4_compile.compile(quantize_weights="on_change")` binds the learner's graphs to a
`WeightStore` (`fp4_compile/rollout/weight_store.py`) and rewrites the store once per optimizer
step (before the first micro-batch after it). Two forms of that store, as rows of the model:

- "on_change" (the store holds what the graphs read): the on-grid copies where the lowering gave
  a weight one, written in place by the quantize kernels (`codegen.quantize_into`); per entry
  one quantize launch (reads W, writes the forms the graphs read) and a copy of the global
  decode (a few bytes); per shared-scale group one group amax. The graphs decode nothing.
- "on_change, decode per call" (the store before it held on-grid copies): packed bytes only,
  written by a quantize into new tensors and then copied into the store (codes, scales, global
  decode: three copies); the forward decodes each weight's on-grid copy from the store in every
  call (`fp4_compile::ongrid_weight` nodes, counted by the graph rules).
- "on_change, row maxima from the optimizer (not built)": a what-if, "on_change" without the
  experts' row maxima pass (an AdamW that writes the expert weights would emit them).
Experts' weights [E, N, K] (one global scale per expert) quantize in two steps on sm_90, the row
maxima (a read of W) then the codes (`rules.EXPERT_ROW_MAXIMA`).
"""

from __future__ import annotations

import torch

from ..rollout.weight_store import WeightStore
from .rules import EXPERT_ROW_MAXIMA, OpCost, per_expert_quantize

FORMS = {
    "on_change": {"hold_ongrid": True, "copies": False},
    "on_change, decode per call": {"hold_ongrid": False, "copies": True},
    # what-if, not built: the optimizer step that writes the expert weights emits their row
    # maxima, so the refresh skips that read (docs/learner_performance.md, "What is open")
    "on_change, row maxima from the optimizer (not built)": {
        "hold_ongrid": True,
        "copies": False,
        "row_maxima_given": True,
    },
}


def learner_store(model: torch.nn.Module, form: str):
    """A store of `model`'s parameters (meta tensors) in `form` (`FORMS`): bound graphs get the
    inputs the learner's would (no group GEMM fusion: the learner's graphs keep one GEMM per
    linear); it is never refreshed (no kernel runs)."""
    return WeightStore(
        dict(model.named_parameters()),
        hold_ongrid=FORMS[form]["hold_ongrid"],
        fuse_groups=False,
    )


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else int(t.numel()) * t.element_size()


def refresh_rows(store, form: str) -> list[OpCost]:
    """The store's rewrite after an optimizer step, per entry (see the module docstring)."""
    copies = FORMS[form]["copies"]
    rows, groups = [], set()
    for name, e in store.entries.items():
        group = e.spec.group
        if group and group not in groups:
            groups.add(group)
            read = sum(_nbytes(store.params[m]) for m in group)
            rows.append(
                OpCost(
                    op="refresh: weight_group_amax",
                    nodes=[name],
                    launches=1,
                    bytes_read=read,
                    bytes_written=4,
                    flops=0,
                )
            )
        packed = _nbytes(e.codes) + _nbytes(e.scales)
        gd = _nbytes(e.global_decode)
        op = "quantize_with_ongrid" if e.ongrid is not None else "quantize"
        w = store.params[name]
        if per_expert_quantize(e.spec.global_scale) and not FORMS[form].get("row_maxima_given"):
            rows.append(
                OpCost(
                    op="refresh: expert weight row maxima",
                    nodes=[name],
                    launches=1,
                    bytes_read=_nbytes(w),
                    bytes_written=w.numel() // w.shape[-1] * 4,
                    flops=0,
                    note=EXPERT_ROW_MAXIMA,
                )
            )
        rows.append(
            OpCost(
                op=f"refresh: {op}",
                nodes=[name],
                launches=1,
                bytes_read=_nbytes(w) + (4 if group else 0),
                bytes_written=packed + gd + _nbytes(e.ongrid),
                flops=0,
            )
        )
        if copies:
            rows.append(
                OpCost(
                    op="refresh: copy into the store",
                    nodes=[name],
                    launches=3,
                    bytes_read=packed + gd,
                    bytes_written=packed + gd,
                    flops=0,
                )
            )
        else:
            rows.append(
                OpCost(
                    op="refresh: global decode copy",
                    nodes=[name],
                    launches=1,
                    bytes_read=gd,
                    bytes_written=gd,
                    flops=0,
                )
            )
    return rows
