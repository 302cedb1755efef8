"""fuse_residual_adds (bitwise): tiny Qwen3 and Qwen3-MoE lowered with the residual adds fused
into the norms after them (rms_norm_quantize -> add_rms_norm_quantize under strict,
invariant_rms_norm -> invariant_add_rms_norm under bf16 and without the quantize fusions) equal
the same models lowered without the pass, in the logits and in every parameter gradient, bit for
bit (the lowered graphs run eagerly through the ops' CPU references). Every residual add read by
a norm is fused (2 per layer, less the first layer's input norm, plus the final norm), no add is
left in front of a norm."""

import pytest
import torch

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes.fuse_quantize_into_producers import fuse_quantize_into_producers
from fp4_compile.passes.fuse_residual_adds import fuse_residual_adds
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal

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


@pytest.mark.parametrize(
    ("arch", "recipe", "dropped"),
    [
        ("qwen3", "strict", ()),
        ("qwen3_moe", "strict", ()),
        ("qwen3", "bf16", ()),
        ("qwen3", "strict", (fuse_quantize_into_producers,)),
    ],
)
def test_fused_residual_adds_are_bitwise_the_unfused_graph(arch, recipe, dropped, monkeypatch):
    full = passes.PIPELINE
    monkeypatch.setattr(passes, "PIPELINE", tuple(p for p in full if p not in dropped))
    rec = getattr(NVFP4Recipe, recipe)()
    model = MODELS[arch](layers=LAYERS, dtype=torch.bfloat16)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2)
    )
    y, g, report = _run(model, ids, rec)
    assert report.counts["residual_add_fused"] == 2 * LAYERS
    fused_ops = {"fp4_compile::add_rms_norm_quantize", "fp4_compile::invariant_add_rms_norm"}
    assert sum(name.split(".")[0] in fused_ops for name in report.census) == 2 * LAYERS
    kept = tuple(p for p in full if p not in dropped and p is not fuse_residual_adds)
    monkeypatch.setattr(passes, "PIPELINE", kept)
    y_ref, g_ref, report_ref = _run(model, ids, rec)
    assert "residual_add_fused" not in report_ref.counts
    what = f"({arch}, {recipe}, without {[p.__name__ for p in dropped]})"
    assert_bitwise_equal(y, y_ref, f"logits {what}")
    assert g.keys() == g_ref.keys() and len(g) > 0
    for name in g:
        assert_bitwise_equal(g[name], g_ref[name], f"grad {name} {what}")
