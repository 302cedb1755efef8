"""share_activation_quantize (bitwise): tiny Qwen3 and Qwen3-MoE lowered with the pass equal
the same models lowered without it, in the forward and in every parameter gradient, bit for bit
(the lowered graphs run eagerly through the ops' CPU references); the pass leaves one
quantize_activation per distinct X (q/k/v; dense gate/up), quantizing X^T only where an NVFP4
wgrad needs it; `explain` reports what was shared."""

import pytest
import torch

import fp4_compile
import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes.share_activation_quantize import share_activation_quantize
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal

RECIPES = {
    "strict": NVFP4Recipe.strict(),
    "te": NVFP4Recipe.te(),
    "bf16_wgrad": NVFP4Recipe.strict(wgrad="bf16"),
}
MODELS = {"qwen3": tiny_qwen3, "qwen3_moe": tiny_qwen3_moe}


def _without(graph_pass):
    return tuple(p for p in passes.PIPELINE if p is not graph_pass)


def _run(model, ids, recipe, sink):
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    set_sr_state(None)  # both runs draw the same stochastic-rounding streams
    compiled = torch.compile(model, backend=lowering_only_backend(recipe, sink), fullgraph=True)
    logits = compiled(ids, use_cache=False).logits
    logits.float().pow(2).mean().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_shared_quantize_is_bitwise_the_unshared_graph(arch, preset, monkeypatch):
    recipe = RECIPES[preset]
    model = MODELS[arch](layers=2)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1)
    )
    shared_reports: list = []
    y, g = _run(model, ids, recipe, shared_reports)
    monkeypatch.setattr(passes, "PIPELINE", _without(share_activation_quantize))
    plain_reports: list = []
    y_ref, g_ref = _run(model, ids, recipe, plain_reports)
    (shared,), (plain,) = shared_reports, plain_reports
    assert "activation_quantize_shared" not in plain.counts
    # q/k/v per layer, and the dense MLP's gate/up
    per_layer = 2 if arch == "qwen3" else 1
    assert shared.counts["activation_quantize_shared"] == 2 * per_layer
    assert shared.counts["activation_quantize_saved"] == 2 * (2 + (per_layer - 1))
    assert_bitwise_equal(y, y_ref, f"logits ({arch}, {preset})")
    assert g.keys() == g_ref.keys() and len(g) > 0
    for name in g:
        assert_bitwise_equal(g[name], g_ref[name], f"grad {name} ({arch}, {preset})")


def _lowered_graph(model, ids, recipe, *, grad: bool):
    graphs = []

    def backend(gm, example_inputs, **unused):
        passes.run_pipeline(gm, recipe)
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        torch.compile(model, backend=backend, fullgraph=True)(ids, use_cache=False)
    (gm,) = graphs
    return gm


def _transposed_flags(gm):
    """The `transposed` argument of every node that quantizes an X for NVFP4 linears: the
    shared quantize, or the producer that emits it (`fuse_quantize_into_producers`)."""
    ops = torch.ops.fp4_compile
    position = {
        ops.quantize_activation.default: 3,
        ops.rms_norm_quantize.default: 4,
        ops.add_rms_norm_quantize.default: 5,  # the norm after a residual add (fuse_residual_adds)
        ops.silu_mul_quantize.default: 4,
    }
    return [
        n.args[position[n.target]]
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target in position
    ]


def test_transposed_operand_only_where_an_nvfp4_wgrad_reads_it():
    """X^T is quantized in the forward only when the graph tracks the weights' gradients and the
    recipe's wgrad is NVFP4; an inference graph (no_grad, frozen weights) or a BF16 wgrad does
    not pay for it."""
    model = tiny_qwen3(layers=1)
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    # q/k/v's X and gate/up's X (emitted by their norms), down_proj's X (by the SwiGLU)
    strict = NVFP4Recipe.strict()
    assert _transposed_flags(_lowered_graph(model, ids, strict, grad=True)) == [True] * 3
    assert _transposed_flags(_lowered_graph(model, ids, strict, grad=False)) == [False] * 3
    bf16_wgrad = NVFP4Recipe.strict(wgrad="bf16")
    assert _transposed_flags(_lowered_graph(model, ids, bf16_wgrad, grad=True)) == [False] * 3
    model.requires_grad_(False)
    assert _transposed_flags(_lowered_graph(model, ids, strict, grad=True)) == [False] * 3


def test_explain_names_the_linears_sharing_one_quantize():
    model = tiny_qwen3(layers=1)
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    (rep,) = fp4_compile.explain(model, ids, use_cache=False, print_report=False)
    notes = [n for n in rep.notes if n.startswith("one activation quantize shared by")]
    assert len(notes) == 2
    assert all(p in notes[0] for p in ("q_proj", "k_proj", "v_proj"))
    assert all(p in notes[1] for p in ("gate_proj", "up_proj"))
    assert "activation_quantize_shared: 2" in rep.table()


def test_exported_rollout_shares_the_quantize_without_the_transposed_operand():
    """The exported rollout graph (inference) runs the same pass, so its op census stays the
    learner forward's, and never quantizes X^T."""
    from fp4_compile.rollout.export import export_rollout

    art = export_rollout(
        tiny_qwen3(layers=1), recipe=NVFP4Recipe.strict(), max_batch=2, max_seq_len=16
    )
    assert _transposed_flags(art.program.graph_module) == [False] * 3
