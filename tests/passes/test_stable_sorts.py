"""The stable_sorts pass: every sort / argsort spelling becomes stable (equal keys keep their
order), at Dynamo level and at ATen (export) level, and the verify pass refuses an unstable one."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.passes import LoweringError, run_pipeline
from fp4_compile.passes.report import LoweringReport
from fp4_compile.passes.stable_sorts import stable_sorts
from fp4_compile.passes.verify import verify


class Sorts(torch.nn.Module):
    def forward(self, ids):
        values, perm = torch.sort(ids)
        _, perm2 = ids.sort(-1, True)
        order = torch.argsort(ids, dim=-1)
        return values, perm, perm2, order


def _ties():
    # many equal keys: an unstable sort may order them any way
    return torch.tensor([[3, 1, 3, 0, 1, 3, 0, 2] * 8])


def _expected(ids):
    values, perm = torch.sort(ids, stable=True)
    _, perm2 = torch.sort(ids, dim=-1, descending=True, stable=True)
    return values, perm, perm2, torch.argsort(ids, dim=-1, stable=True)


def _graph_of(module, ids):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(module, backend=capture, fullgraph=True)(ids)
    return graphs[0]


def _sort_nodes(gm):
    return [n for n in gm.graph.nodes if "sort" in str(n.target)]


def test_dynamo_graph_sorts_become_stable():
    ids = _ties()
    gm = _graph_of(Sorts(), ids)
    report = LoweringReport(recipe_fingerprint="")
    stable_sorts(gm, NVFP4Recipe.strict(), report)
    nodes = _sort_nodes(gm)
    assert len(nodes) == 3 and all(n.kwargs["stable"] is True for n in nodes)
    assert report.counts["stable_sort"] == 3
    for got, want in zip(gm(ids), _expected(ids)):
        assert torch.equal(got, want)


def test_exported_graph_sorts_become_stable():
    ids = _ties()
    gm = torch.export.export(Sorts(), (ids,)).run_decompositions({}).module()
    report = LoweringReport(recipe_fingerprint="")
    stable_sorts(gm, NVFP4Recipe.strict(), report)
    nodes = _sort_nodes(gm)
    assert nodes and all(n.target._overloadname == "stable" for n in nodes)
    assert all(n.kwargs["stable"] is True for n in nodes)
    for got, want in zip(gm(ids), _expected(ids)):
        assert torch.equal(got, want)


def test_verify_refuses_an_unstable_sort():
    gm = _graph_of(Sorts(), _ties())
    with pytest.raises(LoweringError, match="unstable sort"):
        verify(gm, NVFP4Recipe.strict(), LoweringReport(recipe_fingerprint=""))
    run_pipeline(_graph_of(Sorts(), _ties()), NVFP4Recipe.strict())  # the pipeline makes it pass
