"""The rollout engine with the step's mask from `fp4_compile::invariant_position_mask` (one op
for the mask, its attention kernel arguments and the attentions' lengths) against the same
engine building the mask with the torch ops it ran before (then lowered to
`invariant_attention_mask_args` and two `full`s).

Tier: bitwise. On tiny Qwen3 (CPU), static and paged caches, continuously batched (more requests
than max_batch, so prefills of Tq > 1 and decodes): the same tokens and the same log-probs (raw
bytes); with the op, its log-probs equal the learner's sequence log-probs bit for bit (the graph's
structure: tests/passes/test_lower_attention.py).
"""

import copy

import pytest
import torch

import fp4_compile.rollout.step as step_module
from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.invariant import decode_reference
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]]
BUDGETS = [5, 2, 4, 3]
TEMPERATURE = 0.8


def _engine(learner, kv_cache):
    extra = dict(kv_tokens=192, kv_page_size=16) if kv_cache == "paged" else {}
    model = copy.deepcopy(learner)
    rec = NVFP4Recipe.strict()
    return RolloutEngine(model, recipe=rec, max_batch=2, max_seq_len=40, kv_cache=kv_cache, **extra)


def _generate(engine):
    return engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)


@pytest.mark.parametrize("kv_cache", ["static", "paged"])
def test_position_mask_engine_is_bitwise_the_old_mask_and_the_learner(kv_cache, monkeypatch):
    torch.manual_seed(0)
    learner = tiny_qwen3(layers=2, dtype=torch.bfloat16).eval()
    torch._dynamo.reset()
    out = _generate(_engine(learner, kv_cache))

    torch._dynamo.reset()
    monkeypatch.setattr(step_module, "attention_mask_4d", decode_reference.position_mask)
    ref = _generate(_engine(learner, kv_cache))
    monkeypatch.undo()
    assert out.tokens == ref.tokens, kv_cache
    for i, (a, b) in enumerate(zip(out.logprobs, ref.logprobs)):
        assert_bitwise_equal(a, b, f"{kv_cache}: request {i}, position mask op vs old mask")

    torch._dynamo.reset()
    compiled = torch.compile(learner, backend="minite", options={"recipe": NVFP4Recipe.strict()})
    seqs = [p + t for p, t in zip(PROMPTS, out.tokens)]
    with torch.no_grad():
        want = sequence_logprobs(compiled, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    for i, (a, b) in enumerate(zip(out.logprobs, want)):
        assert_bitwise_equal(a, b.cpu(), f"{kv_cache}: request {i}, rollout vs learner")
