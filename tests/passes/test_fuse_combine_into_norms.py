"""`fuse_combine_into_norms`: in an inference graph, a bf16 `moe_combine` read only (through no-op
casts and views) by the residual add of an `invariant_add_rms_norm` becomes, with that norm, one
`fp4_compile::moe_combine_add_rms_norm`; the graph's outputs are unchanged, bitwise. It refuses
(graph unchanged, reason in the notes) a graph that tracks a gradient, a combine with a
row_mask, FP32, and a combine with other readers (or a cast that changes its dtype)."""

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile import NVFP4Recipe
from fp4_compile.passes.fuse_combine_into_norms import fuse_combine_into_norms
from fp4_compile.passes.report import LoweringReport
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
T, K, H = 4, 2, 96
EPS = 1e-6


def _plain(r, x, w, idx, nw):
    c = ops.moe_combine(x, w, idx, K)
    return ops.invariant_add_rms_norm(r, c.reshape(T, 1, H), nw, EPS)


def _first_cast_inverse(r, x, w, idx, nw):
    """transformers' `.to(dtype)` (a no-op), the combine as the first addend, an idx_inverse."""
    inverse = torch.argsort(idx)
    c = ops.moe_combine(x, w, idx, K, idx_inverse=inverse).to(torch.bfloat16)
    y, h = ops.invariant_add_rms_norm(c.view(T, 1, H), r, nw, EPS)
    return y * 2, h


def _row_mask(r, x, w, idx, nw):
    c = ops.moe_combine(x, w, idx, K, row_mask=idx < 1)
    return ops.invariant_add_rms_norm(r, c.reshape(T, 1, H), nw, EPS)


def _read_twice(r, x, w, idx, nw):
    c = ops.moe_combine(x, w, idx, K)
    return *ops.invariant_add_rms_norm(r, c.reshape(T, 1, H), nw, EPS), c


def _upcast(r, x, w, idx, nw):
    c = ops.moe_combine(x, w, idx, K).float()
    return ops.invariant_add_rms_norm(r.float(), c.reshape(T, 1, H), nw.float(), EPS)


def _inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    r = (torch.randn(T, 1, H, generator=g) * 2).to(dtype)
    x = (torch.randn(T * K, H, generator=g) * 3).to(dtype)
    w = torch.rand(T * K, 1, generator=g).to(dtype)
    idx = torch.randperm(T * K, generator=g)
    nw = (1.0 + 0.3 * torch.randn(H, generator=g)).to(dtype)
    return r, x, w, idx, nw


def _fuse(fn, inputs, *, grad: bool):
    """fn through Dynamo, fuse_combine_into_norms alone on its graph -> (outputs, report, ops)."""
    got = {}

    def backend(gm, example_inputs, **unused):
        got["report"] = LoweringReport(recipe_fingerprint="test")
        fuse_combine_into_norms(gm, NVFP4Recipe.bf16(), got["report"])
        got["targets"] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.set_grad_enabled(grad):
            out = torch.compile(fn, backend=backend, fullgraph=True)(*inputs)
    finally:
        torch._dynamo.reset()
    return out, got["report"], " ".join(got["targets"])


@pytest.mark.parametrize("fn", [_plain, _first_cast_inverse], ids=["plain", "first-cast-inverse"])
def test_fusion_fires_and_changes_no_bit(fn):
    inputs = _inputs()
    out, report, targets = _fuse(fn, inputs, grad=False)
    assert report.counts["combine_fused_into_norm"] == 1
    assert "moe_combine_add_rms_norm" in targets
    assert "moe_combine.default" not in targets and "invariant_add_rms_norm" not in targets
    want = fn(*inputs)
    assert len(out) == len(want)
    for i, (a, b) in enumerate(zip(out, want)):
        assert_bitwise_equal(a, b, f"output {i}")


@pytest.mark.parametrize(
    ("fn", "dtype", "grad", "why"),
    [
        (_plain, torch.bfloat16, True, "tracks a gradient"),
        (_row_mask, torch.bfloat16, False, "row_mask"),
        (_plain, torch.float32, False, "not BF16"),
        (_read_twice, torch.bfloat16, False, "other ops"),
        (_upcast, torch.bfloat16, False, "other ops"),
    ],
    ids=["needs-gradient", "row-mask", "fp32", "read-twice", "upcast"],
)
def test_fusion_refuses_with_a_reason(fn, dtype, grad, why):
    """Refused: the graph keeps both ops, its outputs the same bits, the reason noted."""
    inputs = _inputs(dtype)
    inputs = (inputs[0], inputs[1].requires_grad_(grad), *inputs[2:])
    out, report, targets = _fuse(fn, inputs, grad=grad)
    assert "combine_fused_into_norm" not in report.counts
    assert "moe_combine_add_rms_norm" not in targets and "moe_combine" in targets
    assert any(why in note for note in report.notes), report.notes
    with torch.no_grad():
        want = fn(inputs[0], inputs[1].detach(), *inputs[2:])
    for i, (a, b) in enumerate(zip(out, want)):
        assert_bitwise_equal(a.detach(), b, f"output {i}")
