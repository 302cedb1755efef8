"""`fold_routing_order`: in an inference graph, invariant_routing whose weights and ids only
expert_order reads becomes, with it, one `fp4_compile::routing_order`; the graph's outputs are
unchanged, bitwise. It refuses (graph unchanged, reason in the notes) a graph that needs the
routing's gradient, routing outputs with other readers, and an expert_order of other experts.
On the tiny Qwen3-MoE: one fold per layer under no_grad, none in the training forward, logits
bitwise with and without the pass."""

import pytest
import torch

import fp4_compile
import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile import NVFP4Recipe, passes
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.passes.fold_routing_order import fold_routing_order
from fp4_compile.passes.report import LoweringReport
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
E, K = 10, 3


def _plain(logits):
    w, ids = ops.invariant_routing(logits, K, True)
    return ops.expert_order(ids, w, E, torch.bfloat16)


def _cloned(logits):
    """An FP32 model's `weights.to(float32)`: a clone only expert_order reads."""
    w, ids = ops.invariant_routing(logits, K, True)
    return ops.expert_order(ids, w.clone(), E, torch.float32)


def _clone_read(logits):
    w, ids = ops.invariant_routing(logits, K, True)
    c = w.clone()
    return *ops.expert_order(ids, c, E, torch.float32), c


def _weights_read(logits):
    w, ids = ops.invariant_routing(logits, K, True)
    return *ops.expert_order(ids, w, E, torch.bfloat16), w * 2


def _ids_read(logits):
    w, ids = ops.invariant_routing(logits, K, True)
    return *ops.expert_order(ids, w, E, torch.bfloat16), ids + 1


def _other_experts(logits):
    w, ids = ops.invariant_routing(logits, K, True)
    return ops.expert_order(ids, w, E + 3, torch.bfloat16)


def _fold(fn, logits, *, grad: bool):
    """fn through Dynamo, fold_routing_order alone on its graph -> (outputs, report, census)."""
    got = {}

    def backend(gm, example_inputs, **unused):
        got["report"] = LoweringReport(recipe_fingerprint="test")
        fold_routing_order(gm, NVFP4Recipe.strict(), got["report"])
        got["targets"] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.set_grad_enabled(grad):
            out = torch.compile(fn, backend=backend, fullgraph=True)(logits)
    finally:
        torch._dynamo.reset()
    return out, got["report"], " ".join(got["targets"])


def _logits():
    g = torch.Generator().manual_seed(0)
    x = (torch.randint(-4, 5, (7, E), generator=g).float() / 2).to(torch.bfloat16)
    x[0] = 1.0  # ties
    return x


@pytest.mark.parametrize("fn", [_plain, _cloned], ids=["plain", "cloned-weights"])
def test_fold_fires_and_changes_no_bit(fn):
    logits = _logits()
    out, report, targets = _fold(fn, logits, grad=False)
    assert report.counts["routing_order_folded"] == 1
    assert "routing_order" in targets and "clone" not in targets
    assert "invariant_routing" not in targets and "expert_order" not in targets
    for i, (a, b) in enumerate(zip(out, fn(logits))):
        assert_bitwise_equal(a, b, f"output {i}")


@pytest.mark.parametrize(
    ("fn", "grad", "why"),
    [
        (_plain, True, "gradient"),
        (_weights_read, False, "other readers"),
        (_ids_read, False, "other readers"),
        (_clone_read, False, "other readers"),
        (_other_experts, False, "expert_order of 13 experts"),
    ],
    ids=["needs-gradient", "weights-read", "ids-read", "clone-read", "other-experts"],
)
def test_fold_refuses_with_a_reason(fn, grad, why):
    """Refused: the graph keeps both ops, its outputs the same bits, the reason noted."""
    logits = _logits().requires_grad_(grad)
    out, report, targets = _fold(fn, logits, grad=grad)
    assert "routing_order_folded" not in report.counts
    assert "routing_order" not in targets and "invariant_routing" in targets
    assert any(why in note for note in report.notes), report.notes
    with torch.no_grad():
        want = fn(logits.detach())
    for i, (a, b) in enumerate(zip(out, want)):
        assert_bitwise_equal(a.detach(), b, f"output {i}")


def _compiled_logits(model, ids):
    sink: list = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="minite", fullgraph=True, options={"report_sink": sink})
    with torch.no_grad():
        out = compiled(ids, use_cache=False).logits
    torch._dynamo.reset()
    return out, sink


def test_tiny_qwen3_moe_inference_graph_bitwise(monkeypatch):
    """Under no_grad (an inference graph): one routing_order per layer, and the logits == the
    model compiled without the pass, bitwise. The training forward keeps the two ops."""
    model = tiny_qwen3_moe(layers=2, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 128, (3, 9), generator=torch.Generator().manual_seed(2))
    y, (report,) = _compiled_logits(model, ids)
    assert report.counts["routing_order_folded"] == 2  # one per layer
    assert not any("invariant_routing" in c for c in report.census)
    without = tuple(p for p in passes.PIPELINE if p is not fold_routing_order)
    monkeypatch.setattr(passes, "PIPELINE", without)
    y_ref, (ref,) = _compiled_logits(model, ids)
    assert "routing_order_folded" not in ref.counts
    assert_bitwise_equal(y, y_ref, "logits")
    monkeypatch.undo()
    (train,) = fp4_compile.explain(model, ids, use_cache=False, print_report=False)
    assert train.counts["routing_order_folded"] == 2  # explain runs under no_grad
    sink: list = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="minite", options={"report_sink": sink})
    compiled(ids, use_cache=False).logits.float().mean().backward()
    torch._dynamo.reset()
    assert "routing_order_folded" not in sink[0].counts
    assert any("gradient" in note for note in sink[0].notes), sink[0].notes
