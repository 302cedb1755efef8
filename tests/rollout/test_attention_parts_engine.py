"""The rollout engine with each decode attention handing the output projection its per-head
maxima (`passes/emit_attention_parts.py`, run by the weight store binding after
`defer_decode_codes`: `invariant_attention_parts` + `nvfp4_linear_with_parts`) against the same
engine without that pass.

Tier: bitwise. Tiny Qwen3 in bf16 (the pass takes BF16 decodes), strict recipe, continuously
batched: the same tokens and log-probs (raw bytes) with and without the pass, and the learner's
sequence log-probs from a training (grad-enabled) forward, whose graph keeps
`invariant_attention` and `nvfp4_linear`. The pass must fire in every layer of the decode graphs
(Tq = 1) and nowhere in the prefill graphs. On CPU the ops are the references (the parts are
unread there); the kernel's epilogue and the decode GEMM on the given parts:
tests/codegen/invariant/test_attention_parts.py, and on the GPU, engine included:
tests/gpu/test_gpu_attention_parts.py.
"""

import copy

import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]]
BUDGETS = [5, 2, 4, 3]
TEMPERATURE = 0.8
RECIPE = NVFP4Recipe.strict()


def _generate(model, monkeypatch, *, emit: bool):
    from fp4_compile.rollout import store_binding

    fired: list[int] = []
    emit_parts = store_binding.emit_attention_parts

    def maybe_emit(graph, report=None):
        fired.append(emit_parts(graph, report) if emit else 0)
        return fired[-1]

    with monkeypatch.context() as m:
        m.setattr(store_binding, "emit_attention_parts", maybe_emit)
        torch._dynamo.reset()
        engine = RolloutEngine(copy.deepcopy(model), recipe=RECIPE, max_batch=2, max_seq_len=16)
        out = engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)
    return out, fired


def test_engine_with_attention_parts_is_bitwise_without_and_the_learner(monkeypatch):
    torch.manual_seed(0)
    model = tiny_qwen3(layers=LAYERS, dtype=torch.bfloat16).eval()
    emitted, fired = _generate(model, monkeypatch, emit=True)
    plain, not_fired = _generate(model, monkeypatch, emit=False)
    assert set(fired) == {0, LAYERS}, fired  # prefill graphs none, decode graphs every layer
    assert not any(not_fired)
    assert emitted.tokens == plain.tokens
    for i, (a, b) in enumerate(zip(emitted.logprobs, plain.logprobs)):
        assert len(a) == BUDGETS[i]
        assert_bitwise_equal(a, b, f"request {i}: pass on vs off")

    torch._dynamo.reset()
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    seqs = [p + t for p, t in zip(PROMPTS, emitted.tokens)]
    with torch.enable_grad():  # the training forward: no store binding, the plain ops
        ref = sequence_logprobs(learner, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    for i, (a, b) in enumerate(zip(emitted.logprobs, ref)):
        assert_bitwise_equal(a, b.detach().cpu(), f"request {i}: rollout vs learner")
    torch._dynamo.reset()
