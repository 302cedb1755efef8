"""fuse_quantize_into_producers (bitwise): tiny Qwen3 and Qwen3-MoE lowered with the producer
fusions (RMSNorm -> q/k/v, gate/up, experts' gate_up; SwiGLU -> down, experts' down) equal the
same models lowered without them (and without the shared quantize as well), in the logits and in
every parameter gradient, bit for bit (the lowered graphs run eagerly through the ops' CPU
references). The fusions happen where a norm feeds NVFP4 linears under per-row activation
scales, where a norm or the SwiGLU feeds the experts' grouped GEMMs, and nowhere else."""

import pytest
import torch

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes.fuse_quantize_into_producers import fuse_quantize_into_producers
from fp4_compile.passes.share_activation_quantize import share_activation_quantize
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal

MODELS = {"qwen3": tiny_qwen3, "qwen3_moe": tiny_qwen3_moe}


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


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_norm_quantize_is_bitwise_the_unfused_graph(arch, dtype, monkeypatch):
    recipe = NVFP4Recipe.strict()
    model = MODELS[arch](layers=2, dtype=dtype)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2)
    )
    y, g, report = _run(model, ids, recipe)
    # per layer: the input norm (q/k/v) and the post-attention norm (dense gate/up, or the
    # experts' gate_up through the token gather)
    assert report.counts["rms_norm_quantize_fused"] == 4
    moe = 0 if arch == "qwen3" else 2  # per layer, the experts' gate_up and down
    assert report.counts.get("expert_input_from_norm", 0) == moe
    assert report.counts["silu_mul_quantize_fused"] == 2  # dense down_proj or experts' down
    assert report.counts.get("expert_input_from_silu_mul", 0) == moe
    full = passes.PIPELINE
    for dropped in (
        (fuse_quantize_into_producers,),
        (fuse_quantize_into_producers, share_activation_quantize),
    ):
        monkeypatch.setattr(passes, "PIPELINE", tuple(p for p in full if p not in dropped))
        y_ref, g_ref, report_ref = _run(model, ids, recipe)
        assert not {"rms_norm_quantize_fused", "silu_mul_quantize_fused"} & report_ref.counts.keys()
        what = f"({arch}, {dtype}, without {[p.__name__ for p in dropped]})"
        assert_bitwise_equal(y, y_ref, f"logits {what}")
        assert g.keys() == g_ref.keys() and len(g) > 0
        for name in g:
            assert_bitwise_equal(g[name], g_ref[name], f"grad {name} {what}")


def test_no_fusion_under_per_tensor_activation_scales():
    """Per-tensor activation scales (the te recipe) need the whole tensor's amax before any
    block: the norm cannot emit the operand, the pass leaves it."""
    model = tiny_qwen3(layers=1)
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    _, _, report = _run(model, ids, NVFP4Recipe.te())
    assert "rms_norm_quantize_fused" not in report.counts
    assert "silu_mul_quantize_fused" not in report.counts
    assert report.counts["activation_quantize_shared"] == 2
