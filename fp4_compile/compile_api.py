"""`fp4_compile.compile` and `fp4_compile.explain`: the user-facing front door."""

from __future__ import annotations

import torch

from .backend import lowering_only_backend
from .passes import LoweringReport
from .recipe import NVFP4Recipe, as_recipe
from .rollout.weight_store import WeightStore

QUANTIZE_WEIGHTS = ("every_call", "on_change")


def compile(  # noqa: A001
    model,
    *,
    recipe: NVFP4Recipe | dict | str | None = None,
    quantize_weights: str = "every_call",
    **compile_kwargs,
):
    """torch.compile(model, backend="minite", options={"recipe": recipe}, **compile_kwargs).

    quantize_weights="every_call" (torch.compile's behaviour): every forward quantizes the NVFP4
    weights. "on_change": each weight is quantized once per version, before the first call after
    it changed in place (an optimizer step, an in-place load), into a `WeightStore` the graphs
    read (`fp4_compile/rollout/weight_store.py`; on CUDA it holds the on-grid copies the forward
    and dgrad read, so no call decodes them), so the micro-batches of one optimizer step share
    one quantize. The same bits, forward and gradients (tests/rollout/test_learner_weight_store.py).
    A parameter replaced by a new tensor is refused at the next call. The store is the returned
    module's `minite_weight_store`."""
    if "backend" in compile_kwargs or "options" in compile_kwargs:
        raise TypeError("fp4_compile.compile sets backend and options itself; pass recipe=")
    if quantize_weights not in QUANTIZE_WEIGHTS:
        raise ValueError(
            f"quantize_weights must be one of {QUANTIZE_WEIGHTS}, got {quantize_weights!r}"
        )
    options = {"recipe": as_recipe(recipe)}
    store = None
    if quantize_weights == "on_change":
        store = options["weight_store"] = WeightStore.for_learner(model)
    compiled = torch.compile(model, backend="minite", options=options, **compile_kwargs)
    if store is not None:
        compiled.minite_weight_store = store  # its `refreshes` count the quantizes
    return compiled


def explain(
    model,
    *example_inputs,
    recipe: NVFP4Recipe | dict | str | None = None,
    print_report: bool = True,
    **example_kwargs,
):
    """Lower `model` for these inputs and report each GEMM: what it became, and why when it stays
    BF16. Runs the lowered graph once (eagerly, no Inductor). Returns the list of reports, one
    per captured graph."""
    recipe = as_recipe(recipe)
    reports: list[LoweringReport] = []
    torch._dynamo.reset()
    try:
        compiled = torch.compile(
            model, backend=lowering_only_backend(recipe, reports), fullgraph=True
        )
        with torch.no_grad():
            compiled(*example_inputs, **example_kwargs)
    except torch._dynamo.exc.BackendCompilerFailed as e:
        # the lowering's own error (LoweringError, ValueError), not Dynamo's wrapper around it
        raise e.inner_exception from None
    finally:
        torch._dynamo.reset()
    if print_report:
        for i, rep in enumerate(reports):
            print(f"graph {i}:\n{rep.table()}")
    return reports
