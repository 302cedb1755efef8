"""The rollout engine with the step's launches outside the layers fused, against the same
engine without each fusion:
- the step's mask from `fp4_compile::invariant_position_mask` (one op for the mask, its attention
  kernel arguments and the attentions' lengths) vs the torch ops it ran before (then lowered to
  `invariant_attention_mask_args` and two `full`s), static and paged caches;
- the rotary tables from `fp4_compile::rotary_tables` (`passes/fuse_rotary_tables.py`) vs the
  pipeline without the pass (angles, `fp4_compile::cos`, `fp4_compile::sin`), strict and bf16.

Tier: bitwise. On tiny Qwen3 (CPU), continuously batched (more requests than max_batch, so
prefills of Tq > 1 and decodes): the same tokens and the same log-probs (raw bytes); with the
fusion, its log-probs equal the learner's sequence log-probs bit for bit (the graphs' structure:
tests/passes/test_lower_attention.py, tests/passes/test_fuse_rotary_tables.py).
"""

import copy

import pytest
import torch

import fp4_compile.passes as passes
import fp4_compile.rollout.step as step_module
from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.invariant import decode_reference
from fp4_compile.models import tiny_qwen3
from fp4_compile.passes.fuse_rotary_tables import fuse_rotary_tables
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]]
BUDGETS = [5, 2, 4, 3]
TEMPERATURE = 0.8


def _engine(learner, kv_cache, recipe="strict"):
    extra = dict(kv_tokens=192, kv_page_size=16) if kv_cache == "paged" else {}
    model = copy.deepcopy(learner)
    rec = getattr(NVFP4Recipe, recipe)()
    return RolloutEngine(model, recipe=rec, max_batch=2, max_seq_len=40, kv_cache=kv_cache, **extra)


def _assert_learner(learner, out, recipe, what):
    torch._dynamo.reset()
    rec = getattr(NVFP4Recipe, recipe)()
    compiled = torch.compile(learner, backend="minite", options={"recipe": rec})
    seqs = [p + t for p, t in zip(PROMPTS, out.tokens)]
    with torch.no_grad():
        want = sequence_logprobs(compiled, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    for i, (a, b) in enumerate(zip(out.logprobs, want)):
        assert_bitwise_equal(a, b.cpu(), f"{what}: request {i}, rollout vs learner")


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

    _assert_learner(learner, out, "strict", kv_cache)


@pytest.mark.parametrize("recipe", ["strict", "bf16"])
def test_rotary_tables_engine_is_bitwise_the_unfused_one_and_the_learner(recipe, monkeypatch):
    torch.manual_seed(0)
    learner = tiny_qwen3(layers=2, dtype=torch.bfloat16).eval()
    torch._dynamo.reset()
    out = _generate(_engine(learner, "static", recipe))

    torch._dynamo.reset()
    full = passes.PIPELINE
    monkeypatch.setattr(passes, "PIPELINE", tuple(p for p in full if p is not fuse_rotary_tables))
    ref = _generate(_engine(learner, "static", recipe))
    monkeypatch.undo()
    assert out.tokens == ref.tokens, recipe
    for i, (a, b) in enumerate(zip(out.logprobs, ref.logprobs)):
        assert_bitwise_equal(a, b, f"{recipe}: request {i}, rotary_tables vs cos / sin")
    _assert_learner(learner, out, recipe, recipe)
