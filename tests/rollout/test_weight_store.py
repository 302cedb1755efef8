"""The rollout engine's weight store (fp4_compile/rollout/weight_store.py): its graphs read the
quantized weights as inputs, quantize no weight per call, and after `update_weights` the next
generate uses the new weights bit for bit (log-probs == the learner's `sequence_logprobs`), also
after an in-place fused optimizer step that bumps no version counter, for an engine sharing the
learner's module and for an engine holding its own copy."""

import copy

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.nvfp4 import group_amax
from fp4_compile.codegen.nvfp4 import quantize as quantize_mod
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1]]
RECIPE = NVFP4Recipe.strict()


def _generate(engine):
    return engine.generate(PROMPTS, max_new_tokens=6, seed=3)


def _fused_step(model):
    """An in-place AdamW step (fused: no version counter moves), every matrix changed."""
    params = [p for p in model.parameters() if p.dim() >= 2]
    for p in params:
        p.grad = torch.randn_like(p)
    versions = [p._version for p in params]
    torch.optim.AdamW(params, lr=0.05, fused=True).step()
    assert [p._version for p in params] == versions, "premise: the fused step bumps nothing"


def _assert_learner_logprobs(model, out, what):
    torch._dynamo.reset()
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    seqs = [p + t for p, t in zip(PROMPTS, out.tokens)]
    with torch.no_grad():
        ref = sequence_logprobs(learner, seqs, [len(p) for p in PROMPTS])
    for i, (a, b) in enumerate(zip(out.logprobs, ref)):
        assert_bitwise_equal(a, b, f"{what}: request {i}")


@pytest.mark.parametrize("shared", [True, False], ids=["shared_module", "own_copy"])
def test_update_weights_reaches_the_next_generate_bitwise(shared):
    torch.manual_seed(0)
    learner_model = tiny_qwen3_moe(layers=1)
    torch._dynamo.reset()
    engine_model = learner_model if shared else copy.deepcopy(learner_model)
    engine = RolloutEngine(engine_model, recipe=RECIPE, max_batch=4, max_seq_len=32)
    before = _generate(engine)
    store = engine.weight_store
    old_codes = {n: t[0].clone() for n, t in store.tensors.items()}
    _fused_step(learner_model)
    engine.update_weights(learner_model)
    assert store.refreshes == 1
    changed = [n for n, c in old_codes.items() if not torch.equal(c, store.tensors[n][0])]
    assert changed, "the update must rewrite the stored codes (else no test)"
    after = _generate(engine)
    assert engine.programs_built == 1, "the decode program is reused across the update"
    assert after.tokens != before.tokens, "the update must change the rollout (else no test)"
    _assert_learner_logprobs(learner_model, after, f"after update_weights (shared={shared})")


def test_rollout_graphs_quantize_no_weight_per_call(monkeypatch):
    """Every NVFP4 weight of the lowering is a store entry (bound in prefill and decode graphs),
    and a generate call with compiled graphs runs no weight quantize and no group amax."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = tiny_qwen3_moe(layers=1).eval()
    engine = RolloutEngine(model, recipe=RECIPE, max_batch=4, max_seq_len=32)
    first = _generate(engine)
    layer = "model.layers.0."
    want = {layer + f"self_attn.{m}_proj.weight" for m in "qkvo"}
    want |= {layer + "mlp.experts.gate_up_proj", layer + "mlp.experts.down_proj"}
    assert set(engine.weight_store.specs) == want
    assert engine.weight_store.sites_bound == 2 * len(want), "prefill and decode graphs"
    calls = []
    real_quantize, real_amax = quantize_mod._quantize_impl, group_amax._compute

    def counting_quantize(x, block, *args, **kw):
        calls.append(("quantize", block))
        return real_quantize(x, block, *args, **kw)

    def counting_amax(weights):
        calls.append(("group_amax",))
        return real_amax(weights)

    monkeypatch.setattr(quantize_mod, "_quantize_impl", counting_quantize)
    monkeypatch.setattr(group_amax, "_compute", counting_amax)
    again = _generate(engine)
    assert not [c for c in calls if c[0] == "group_amax" or c[1] == "16x16"], calls
    assert again.tokens == first.tokens
    for a, b in zip(again.logprobs, first.logprobs):
        assert_bitwise_equal(a, b, "second call")


def test_replaced_parameters_are_refused():
    """Parameters replaced by new tensors (not written in place) would leave the store and the
    programs reading the old ones: generate and update_weights refuse them by name."""
    torch._dynamo.reset()
    model = tiny_qwen3_moe(layers=1).eval()
    engine = RolloutEngine(model, recipe=RECIPE, max_batch=2, max_seq_len=16, compile=False)
    q = model.model.layers[0].self_attn.q_proj
    q.weight = torch.nn.Parameter(q.weight.detach().clone())
    with pytest.raises(ValueError, match="q_proj.weight.*in place"):
        engine.generate([[1, 2]], max_new_tokens=2)
    with pytest.raises(ValueError, match="q_proj.weight.*in place"):
        engine.update_weights(model)


def test_cuda_graphs_need_a_cuda_device():
    model = tiny_qwen3_moe(layers=1).eval()
    with pytest.raises(ValueError, match="cuda_graphs"):
        RolloutEngine(model, recipe=RECIPE, device="cpu", cuda_graphs=True)
    with pytest.raises(TypeError, match="cuda_graphs"):
        RolloutEngine(model, recipe=RECIPE, device="cpu", cuda_graphs="yes")
