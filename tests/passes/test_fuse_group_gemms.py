"""fuse_group_gemms (passes/fuse_group_gemms.py), on a small q/k/v graph bound to a weight store
(`WeightStore.bind_dynamo_graph` with no gradient, the rollout engine's binding).

Bitwise: the bound graph with the store's fuse_groups on runs ONE GEMM for q/k/v over the
group's buffer and its three outputs equal, raw bytes, the three GEMMs of the same graph with
fuse_groups off (the ops' CPU references, run eagerly). Op counts: 3 GEMMs -> 1, the report
counts the group and the launches saved. Refusals, with the reason in the report's notes and the
graph left as it was: a member missing from the graph, a member with a bias, members reading
different X.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.nvfp4.gemm_call import GemmCall, is_gemm
from fp4_compile.passes import LoweringReport, fuse_group_gemms, run_pipeline
from fp4_compile.rollout.weight_store import WeightStore
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.strict()
K, N = 64, {"q_proj": 64, "k_proj": 32, "v_proj": 32}


class QKV(torch.nn.Module):
    """q/k/v of one attention (one shared-scale group); `x_kv` given: k and v read it."""

    def __init__(self, *, bias: bool = False):
        super().__init__()
        for name, n in N.items():
            setattr(self, name, torch.nn.Linear(K, n, bias=bias))

    def forward(self, x, x_kv=None):
        x_kv = x if x_kv is None else x_kv
        return self.q_proj(x), self.k_proj(x_kv), self.v_proj(x_kv)


def _gemms(gm) -> list:
    return [n for n in gm.graph.nodes if is_gemm(n)]


def _bind(module, inputs, *, fuse_groups: bool):
    """(outputs, the bound graph, its report): `module` compiled with no gradient, its graph
    lowered and bound to a store of its parameters, then run eagerly."""
    store = WeightStore(dict(module.named_parameters()), fuse_groups=fuse_groups)
    got = {}

    def backend(gm, example_inputs, **unused):
        report = run_pipeline(gm, RECIPE)
        bound, _, extra = store.bind_dynamo_graph(gm, example_inputs, report)
        got.update(gm=bound, report=report)
        return lambda *args: bound(*args, *extra)

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(module, backend=backend, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    return out, got["gm"], got["report"], store


def _inputs(rows, num=1):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(rows, K, generator=g) * torch.logspace(-2, 2, K) for _ in range(num)]


@pytest.mark.parametrize("rows", [1, 5])
def test_qkv_run_as_one_gemm_bitwise_the_three(rows):
    torch.manual_seed(0)
    module = QKV().eval()
    x = _inputs(rows)
    fused, gm, report, store = _bind(module, x, fuse_groups=True)
    plain, gm_plain, report_plain, _ = _bind(module, x, fuse_groups=False)
    assert len(_gemms(gm_plain)) == 3 and len(_gemms(gm)) == 1
    (gemm,) = _gemms(gm)
    assert GemmCall.of(gemm).weight_operand().codes.meta["val"].shape == (sum(N.values()), K // 2)
    assert report.counts["gemm_groups_fused"] == 1
    assert report.counts["gemm_launches_saved"] == 2
    assert "gemm_groups_fused" not in report_plain.counts
    assert store.groups_fused == 1
    for name, a, b in zip(N, fused, plain):
        assert a.shape == (rows, N[name])
        assert_bitwise_equal(a, b, f"{name} fused vs alone ({rows} rows)")


def test_members_reading_different_x_are_not_fused():
    torch.manual_seed(0)
    module = QKV().eval()
    x, x_kv = _inputs(3, num=2)
    out, gm, report, store = _bind(module, [x, x_kv], fuse_groups=True)
    plain, _, _, _ = _bind(module, [x, x_kv], fuse_groups=False)
    assert len(_gemms(gm)) == 3 and store.groups_fused == 0
    assert any(
        "(the members read different X operands)" in note and "q_proj" in note
        for note in report.notes
    ), report.notes
    for name, a, b in zip(N, out, plain):
        assert_bitwise_equal(a, b, name)


def test_a_member_with_a_bias_is_not_fused():
    torch.manual_seed(0)
    module = QKV(bias=True).eval()
    _, gm, report, store = _bind(module, _inputs(2), fuse_groups=True)
    assert len(_gemms(gm)) == 3 and store.groups_fused == 0
    assert any("(a member has a bias)" in note for note in report.notes), report.notes


def test_a_group_missing_a_member_is_not_fused():
    """The pass alone, on the unfused bound graph: `layout` places q and k in a group of three
    whose third member no GEMM of the graph reads."""
    torch.manual_seed(0)
    module = QKV().eval()
    _, gm, _, _ = _bind(module, _inputs(2), fuse_groups=False)
    q, k, v = _gemms(gm)
    where = {GemmCall.of(n).weight_operand().codes: i for i, n in enumerate((q, k))}

    def layout(codes):
        return None if codes not in where else ("qkv", where[codes], 3, 64 * where[codes], 64)

    def buffers(key):
        raise AssertionError("a refused group needs no buffer")

    report = LoweringReport(RECIPE.fingerprint())
    assert fuse_group_gemms(gm.graph, layout, buffers, report) == 0
    assert len(_gemms(gm)) == 3
    assert any("(not every member of the group is a GEMM" in note for note in report.notes), (
        report.notes
    )
