"""The narrow_expert_sort_keys pass: the stable sort of the routing op's expert ids runs on uint8
(E <= 256) or int16 keys (1-2 radix passes on CUDA instead of 8), and gives the same values and
indices as the int64 sort, at Dynamo level and at ATen (export) level; other sorts are untouched."""

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers fp4_compile::invariant_routing)
from fp4_compile import NVFP4Recipe
from fp4_compile.passes.narrow_expert_sort_keys import narrow_expert_sort_keys
from fp4_compile.passes.report import LoweringReport
from fp4_compile.passes.stable_sorts import stable_sorts


class ExpertSort(torch.nn.Module):
    """transformers' experts: ids of the top-k routing, flattened, sorted (and a plain sort)."""

    def forward(self, logits, other):
        _, ids = torch.ops.fp4_compile.invariant_routing(logits, 4, False)
        expert_ids = ids.reshape(-1)
        ids_sorted, perm = torch.sort(expert_ids)
        other_sorted, other_perm = torch.sort(other)
        return ids_sorted, perm, other_sorted, other_perm


def _expected(logits, other):
    _, ids = torch.ops.fp4_compile.invariant_routing(logits, 4, False)
    v, p = torch.sort(ids.reshape(-1), stable=True)
    ov, op = torch.sort(other, stable=True)
    return v, p, ov, op


def _lowered(gm):
    report = LoweringReport(recipe_fingerprint="")
    stable_sorts(gm, NVFP4Recipe.strict(), report)
    narrow_expert_sort_keys(gm, NVFP4Recipe.strict(), report)
    return report


def _sort_key_dtypes(gm):
    return [
        n.args[0].meta["val"].dtype
        if "val" in n.args[0].meta
        else n.args[0].meta["example_value"].dtype
        for n in gm.graph.nodes
        if "sort" in str(n.target)
    ]


def _inputs(experts):
    torch.manual_seed(0)
    # many equal ids (64 tokens x 4 slots over E experts) and an int64 tensor with big values
    return torch.randn(64, experts), torch.randint(-(2**40), 2**40, (300,))


@pytest.mark.parametrize(
    "experts,narrow", [(8, torch.uint8), (256, torch.uint8), (300, torch.int16)]
)
def test_dynamo_graph_expert_sort_is_narrowed(experts, narrow):
    logits, other = _inputs(experts)
    captured = []

    def capture(gm, example_inputs):
        captured.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(ExpertSort(), backend=capture, fullgraph=True)(logits, other)
    gm = captured[0]
    report = _lowered(gm)
    assert report.counts["narrow_expert_sort_keys"] == 1
    assert _sort_key_dtypes(gm) == [narrow, torch.int64]  # the plain sort keeps its keys
    got = gm(logits, other)
    for g, w in zip(got, _expected(logits, other)):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_exported_graph_expert_sort_is_narrowed():
    logits, other = _inputs(8)
    gm = torch.export.export(ExpertSort(), (logits, other)).run_decompositions({}).module()
    report = _lowered(gm)
    assert report.counts["narrow_expert_sort_keys"] == 1
    assert _sort_key_dtypes(gm) == [torch.uint8, torch.int64]
    for g, w in zip(gm(logits, other), _expected(logits, other)):
        assert g.dtype == w.dtype and torch.equal(g, w)
