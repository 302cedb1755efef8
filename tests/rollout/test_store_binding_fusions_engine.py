"""The rollout engine with each strict-recipe fusion that the weight store binding runs after
`defer_decode_codes` against the same engine without it:

- `emit_attention_parts` (tiny Qwen3): each decode attention hands the output projection its
  per-head maxima (`invariant_attention_parts` + `nvfp4_linear_with_parts`); it must fire in
  every layer of the decode graphs (Tq = 1) and nowhere in the prefill graphs;
- `fuse_combine_into_norm_parts` (tiny Qwen3-MoE): the MoE combine folded into the next layer's
  input norm (`moe_combine_add_rms_norm_parts`); it must fire in every engine graph (layer i's
  combine into layer i+1's norm; the last layer's goes into the final norm in PIPELINE).

Tier: bitwise. BF16 models (the fusions take BF16), continuously batched (more requests than
max_batch): the same tokens and log-probs (raw bytes) with and without the pass, and the
learner's sequence log-probs from a training (grad-enabled) forward, whose graph keeps the
unfused ops. On CPU the fused ops are their references (the parts are unread there; the combine
op composes the two ops: the interpreter's norm kernels need FP32, the fusion BF16). Their
kernels: tests/codegen/invariant/test_attention_parts.py,
tests/codegen/moe/test_combine_add_rms_norm_parts.py; on the GPU, engine included:
tests/gpu/test_gpu_attention_parts.py, tests/gpu/test_gpu_combine_norm_parts.py.
"""

import copy

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]]
BUDGETS = [5, 2, 4, 3]
TEMPERATURE = 0.8
RECIPE = NVFP4Recipe.strict()
# pass name in store_binding: (model, what it fires per graph: prefill and decode graphs)
CASES = {
    "emit_attention_parts": (tiny_qwen3, {0, LAYERS}),
    "fuse_combine_into_norm_parts": (tiny_qwen3_moe, {LAYERS - 1}),
}


def _generate(model, monkeypatch, name: str, *, on: bool):
    from fp4_compile.rollout import store_binding

    fired: list[int] = []
    the_pass = getattr(store_binding, name)

    def maybe(graph, report=None):
        fired.append(the_pass(graph, report) if on else 0)
        return fired[-1]

    with monkeypatch.context() as m:
        m.setattr(store_binding, name, maybe)
        torch._dynamo.reset()
        engine = RolloutEngine(copy.deepcopy(model), recipe=RECIPE, max_batch=2, max_seq_len=16)
        out = engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)
    return out, fired


@pytest.mark.parametrize("name", list(CASES))
def test_engine_with_the_pass_is_bitwise_without_and_the_learner(name, monkeypatch):
    make, want = CASES[name]
    torch.manual_seed(0)
    model = make(layers=LAYERS, dtype=torch.bfloat16).eval()
    fused, fired = _generate(model, monkeypatch, name, on=True)
    plain, not_fired = _generate(model, monkeypatch, name, on=False)
    assert len(fired) >= 2 and set(fired) == want, fired
    assert not any(not_fired)
    assert fused.tokens == plain.tokens
    for i, (a, b) in enumerate(zip(fused.logprobs, plain.logprobs)):
        assert len(a) == BUDGETS[i]
        assert_bitwise_equal(a, b, f"request {i}: pass on vs off")

    torch._dynamo.reset()
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    seqs = [p + t for p, t in zip(PROMPTS, fused.tokens)]
    with torch.enable_grad():  # the training forward: no store binding, the unfused ops
        ref = sequence_logprobs(learner, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    for i, (a, b) in enumerate(zip(fused.logprobs, ref)):
        assert_bitwise_equal(a, b.detach().cpu(), f"request {i}: rollout vs learner")
    torch._dynamo.reset()
