"""fuse_group_linears (passes/fuse_group_linears.py), on small q/k/v and gate/up graphs (bf16
recipe) bound to a weight store whose BF16 group buffers are made
(`WeightStore.make_linear_groups`) before the compile, as the rollout engine's are.

Bitwise: the bound graph with the store's fuse_groups on runs ONE `invariant_linear` for the
group over its buffer, and its outputs equal, raw bytes, the separate linears of the same graph
with fuse_groups off (the op's CPU reference, run eagerly); FP32 masters (the graph casts the
buffer once) and BF16 masters. The members' parameters are views of the buffer with their own
values. Op counts: 3 linears -> 1, the report counts the group and the launches saved.
Refusals, with the reason in the report's notes and the graph left as it was: members reading
different X, a member with a bias, a member missing from the graph; a learner's parameters (a
gradient) get no buffer.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.passes import LoweringReport, fuse_group_linears, run_pipeline
from fp4_compile.rollout.weight_store import WeightStore
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.bf16()
K, N = 64, {"q_proj": 40, "k_proj": 24, "v_proj": 24}


class QKV(torch.nn.Module):
    """q/k/v of one attention (one group); `x_kv` given: k and v read it."""

    def __init__(self, *, bias: bool = False):
        super().__init__()
        for name, n in N.items():
            setattr(self, name, torch.nn.Linear(K, n, bias=bias))

    def forward(self, x, x_kv=None):
        x_kv = x if x_kv is None else x_kv
        return self.q_proj(x), self.k_proj(x_kv), self.v_proj(x_kv)


def _linears(gm) -> list:
    op = torch.ops.fp4_compile.invariant_linear.default
    return [n for n in gm.graph.nodes if n.target is op]


def _bind(module, inputs, *, fuse_groups: bool):
    """(outputs, the bound graph, its report, the store): `module` compiled with no gradient,
    its graph lowered and bound to a store of its parameters, then run eagerly."""
    store = WeightStore(dict(module.named_parameters()), fuse_groups=fuse_groups)
    store.make_linear_groups()
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


def _inputs(rows, num=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, K, generator=g) * 3).to(dtype) for _ in range(num)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])
def test_qkv_run_as_one_linear_bitwise_the_three(rows, dtype):
    torch.manual_seed(0)
    module = QKV().to(dtype).eval()
    values = {n: p.detach().clone() for n, p in module.named_parameters()}
    x = _inputs(rows, dtype=dtype)
    plain, gm_plain, report_plain, _ = _bind(module, x, fuse_groups=False)
    fused, gm, report, store = _bind(module, x, fuse_groups=True)
    assert len(_linears(gm_plain)) == 3 and len(_linears(gm)) == 1
    (linear,) = _linears(gm)
    assert linear.args[1].meta["val"].shape == (sum(N.values()), K)
    assert report.counts["linear_groups_fused"] == 1
    assert report.counts["gemm_launches_saved"] == 2
    assert "linear_groups_fused" not in report_plain.counts
    assert store.groups_fused == 1
    buffer = store.linear_groups["q_proj.weight"].buffer
    for name, p in module.named_parameters():  # the parameters are the buffer's rows
        assert p.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr(), name
        assert_bitwise_equal(p.detach(), values[name], f"{name} keeps its values")
    for name, a, b in zip(N, fused, plain):
        assert a.shape == (rows, N[name])
        assert_bitwise_equal(a, b, f"{name} fused vs alone ({rows} rows, {dtype})")


def test_members_reading_different_x_are_not_fused():
    torch.manual_seed(0)
    module = QKV().eval()
    x, x_kv = _inputs(3, num=2)
    out, gm, report, store = _bind(module, [x, x_kv], fuse_groups=True)
    assert len(_linears(gm)) == 3 and store.groups_fused == 0
    assert any(
        "(the members read different X operands)" in note and "q_proj" in note
        for note in report.notes
    ), report.notes


def test_a_member_with_a_bias_is_not_fused():
    torch.manual_seed(0)
    module = QKV(bias=True).eval()
    _, gm, report, store = _bind(module, _inputs(2), fuse_groups=True)
    assert len(_linears(gm)) == 3 and store.groups_fused == 0
    assert any("(a member has a bias)" in note for note in report.notes), report.notes


def test_a_group_missing_a_member_is_not_fused():
    """The pass alone, on the unfused bound graph: `layout` places q and k in a group of three
    whose third member no linear of the graph reads."""
    torch.manual_seed(0)
    module = QKV().eval()
    _, gm, _, _ = _bind(module, _inputs(2), fuse_groups=False)
    q, k, _ = _linears(gm)
    weights = {q.args[1].args[0]: 0, k.args[1].args[0]: 1}  # the casts' inputs

    def layout(w):
        return None if w not in weights else ("qkv", weights[w], 3, 40 * weights[w], 40)

    def buffer(key):
        raise AssertionError("a refused group needs no buffer")

    report = LoweringReport(RECIPE.fingerprint())
    assert fuse_group_linears(gm.graph, layout, buffer, report) == 0
    assert len(_linears(gm)) == 3
    assert any("(not every member of the group is a linear" in note for note in report.notes)


def test_a_learners_parameters_get_no_buffer():
    module = QKV().eval()
    module.q_proj.weight.grad = torch.zeros_like(module.q_proj.weight)
    store = WeightStore(dict(module.named_parameters()))
    assert store.make_linear_groups() == 0 and not store.linear_groups


def test_a_second_store_reads_the_first_stores_buffer():
    """Two stores over one module (an engine and a cost model): the second finds the members
    already laid out and views the same storage (no second copy), fused the same way."""
    module = QKV().to(torch.bfloat16).eval()
    first = WeightStore(dict(module.named_parameters()))
    second = WeightStore(dict(module.named_parameters()))
    assert first.make_linear_groups() == 1 and second.make_linear_groups() == 1
    a, b = (s.linear_groups["k_proj.weight"].buffer for s in (first, second))
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert a.shape == b.shape == (sum(N.values()), K) and torch.equal(a, b)
