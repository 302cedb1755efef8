"""The rollout engine with the strict recipe's MoE combine folded into the next layer's input
norm (`passes/fuse_combine_into_norms.fuse_combine_into_norm_parts`, run by the weight store
binding after `defer_decode_codes`: `moe_combine_add_rms_norm_parts`) against the same engine
without that pass.

Tier: bitwise. Tiny Qwen3-MoE in bf16, strict recipe, continuously batched (more requests than
max_batch): the same tokens and log-probs (raw bytes) with and without the pass, and the
learner's sequence log-probs from a training (grad-enabled) forward, whose graph keeps the two
ops. The pass must fire in every engine graph (layer i's combine into layer i+1's input norm;
the last layer's goes into the final norm in PIPELINE). On CPU the op is the composition of the
two ops (their references; the interpreter's norm kernels need FP32, the fusion BF16); its
kernel against the two ops: tests/codegen/moe/test_combine_add_rms_norm_parts.py, and on the
GPU, engine included: tests/gpu/test_gpu_combine_norm_parts.py.
"""

import copy

import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]]
BUDGETS = [5, 2, 4, 3]
TEMPERATURE = 0.8
RECIPE = NVFP4Recipe.strict()


def _generate(model, monkeypatch, *, fuse: bool):
    from fp4_compile.rollout import store_binding

    fired: list[int] = []
    fuse_parts = store_binding.fuse_combine_into_norm_parts

    def maybe_fuse(graph, report=None):
        fired.append(fuse_parts(graph, report) if fuse else 0)
        return fired[-1]

    with monkeypatch.context() as m:
        m.setattr(store_binding, "fuse_combine_into_norm_parts", maybe_fuse)
        torch._dynamo.reset()
        engine = RolloutEngine(copy.deepcopy(model), recipe=RECIPE, max_batch=2, max_seq_len=16)
        out = engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)
    return out, fired


def test_engine_with_the_fused_combine_is_bitwise_without_and_the_learner(monkeypatch):
    torch.manual_seed(0)
    model = tiny_qwen3_moe(layers=LAYERS, dtype=torch.bfloat16).eval()
    fused, fired = _generate(model, monkeypatch, fuse=True)
    plain, not_fired = _generate(model, monkeypatch, fuse=False)
    assert len(fired) >= 2 and set(fired) == {LAYERS - 1}, fired  # prefill and decode graphs
    assert not any(not_fired)
    assert fused.tokens == plain.tokens
    for i, (a, b) in enumerate(zip(fused.logprobs, plain.logprobs)):
        assert len(a) == BUDGETS[i]
        assert_bitwise_equal(a, b, f"request {i}: pass on vs off")

    torch._dynamo.reset()
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    seqs = [p + t for p, t in zip(PROMPTS, fused.tokens)]
    with torch.enable_grad():  # the training forward: no store binding, the two ops
        ref = sequence_logprobs(learner, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    for i, (a, b) in enumerate(zip(fused.logprobs, ref)):
        assert_bitwise_equal(a, b.detach().cpu(), f"request {i}: rollout vs learner")
    torch._dynamo.reset()
