"""`fp4_compile.compile` and `fp4_compile.explain`: the user-facing front door."""

from __future__ import annotations

import torch

from .recipe import NVFP4Recipe, as_recipe


def compile(model, *, recipe: NVFP4Recipe | dict | str | None = None, **compile_kwargs):  # noqa: A001
    """torch.compile(model, backend="minite", options={"recipe": recipe}, **compile_kwargs)."""
    if "backend" in compile_kwargs or "options" in compile_kwargs:
        raise TypeError("fp4_compile.compile sets backend and options itself; pass recipe=")
    return torch.compile(
        model, backend="minite", options={"recipe": as_recipe(recipe)}, **compile_kwargs
    )


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
    from .backend import lowering_only_backend
    from .passes import LoweringReport

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
