"""pair_rms_norms (bitwise): tiny Qwen3 and Qwen3-MoE lowered with each attention's q and k norms
paired into one invariant_rms_norm_pair equal the same models lowered without the pass, in the
logits and in every parameter gradient, bit for bit (the lowered graphs run eagerly through the
ops' CPU references). Every layer's q / k norms are paired (one pair per layer), no
invariant_rms_norm is left where the norms fuse with their quantize (strict); a norm that reads
the other is never paired."""

import pytest
import torch
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes.pair_rms_norms import pair_rms_norms
from fp4_compile.passes.report import LoweringReport
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal

NORM = torch.ops.fp4_compile.invariant_rms_norm.default

MODELS = {"qwen3": tiny_qwen3, "qwen3_moe": tiny_qwen3_moe}
LAYERS = 2


def _run(model, ids, recipe):
    sink: list = []
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    set_sr_state(None)  # both runs draw the same stochastic-rounding streams
    compiled = torch.compile(model, backend=lowering_only_backend(recipe, sink), fullgraph=True)
    logits = compiled(ids, use_cache=False).logits
    logits.float().pow(2).mean().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    (report,) = sink
    return logits.detach(), grads, report


def _names(report, op):
    return [name for name in report.census if name.split(".")[0] == f"fp4_compile::{op}"]


@pytest.mark.parametrize(
    ("arch", "recipe"), [("qwen3", "strict"), ("qwen3_moe", "strict"), ("qwen3", "bf16")]
)
def test_paired_norms_are_bitwise_the_unpaired_graph(arch, recipe, monkeypatch):
    rec = getattr(NVFP4Recipe, recipe)()
    model = MODELS[arch](layers=LAYERS, dtype=torch.bfloat16)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3)
    )
    y, g, report = _run(model, ids, rec)
    assert report.counts["rms_norms_paired"] == LAYERS
    assert len(_names(report, "invariant_rms_norm_pair")) == LAYERS
    # strict: the other norms are fused (quantize, residual); bf16: layer 0's input norm is left
    assert len(_names(report, "invariant_rms_norm")) == (0 if recipe == "strict" else 1)
    full = passes.PIPELINE
    monkeypatch.setattr(passes, "PIPELINE", tuple(p for p in full if p is not pair_rms_norms))
    y_ref, g_ref, report_ref = _run(model, ids, rec)
    assert "rms_norms_paired" not in report_ref.counts
    assert len(_names(report_ref, "invariant_rms_norm")) == 2 * LAYERS + (recipe != "strict")
    assert_bitwise_equal(y, y_ref, f"logits ({arch}, {recipe})")
    assert g.keys() == g_ref.keys() and len(g) > 0
    for name in g:
        assert_bitwise_equal(g[name], g_ref[name], f"grad {name} ({arch}, {recipe})")


def test_a_norm_reading_the_other_is_not_paired():
    """norm(norm(x)) (the second reads the first): left as two norms; two independent norms
    with a reader of the first between them: paired, the reader moved after the pair."""

    def f(x, y, w):
        a = NORM(x, w, 1e-6)
        return NORM(a, w, 1e-6)

    def g(x, y, w):
        a = NORM(x, w, 1e-6).transpose(0, 1)
        b = NORM(y * 2, w, 1e-6)
        return a, b

    x, y, w = torch.randn(3, 16), torch.randn(5, 16), torch.randn(16)
    for fn, paired in ((f, 0), (g, 1)):
        gm = torch.fx.symbolic_trace(fn)
        FakeTensorProp(gm).propagate(x, y, w)
        want = fn(x, y, w)
        report = LoweringReport(recipe_fingerprint="test")
        pair_rms_norms(gm, NVFP4Recipe.strict(), report)
        gm.graph.lint()
        assert report.counts.get("rms_norms_paired", 0) == paired
        got = gm(x, y, w)
        for a, b in zip(got if paired else (got,), want if paired else (want,)):
            assert_bitwise_equal(a, b, fn.__name__)
