"""The rollout engine with the rotary fused into the q / k norm pair
(`passes/fuse_rotary_into_norm_pairs.py`, in PIPELINE) against the same engine without the pass.

Tier: bitwise. On tiny Qwen3 in bf16 (the pass fuses bf16 inference graphs; CPU, the op's
reference against Inductor's rotary kernels with `emulate_precision_casts`), under the strict and
the bf16 recipes, an engine with the pass generates the same tokens and the same log-probs (raw
bytes) as one without it, continuously batched (more requests than max_batch); its log-probs
equal the learner's sequence log-probs bit for bit. Counts: one fusion per layer in every
compiled graph with the pass, none without.
"""

import copy

import pytest
import torch

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.passes.fuse_rotary_into_norm_pairs import fuse_rotary_into_norm_pairs
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]]
BUDGETS = [5, 2, 4, 3]
TEMPERATURE = 0.8


def _generate(engine):
    return engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)


@pytest.mark.parametrize("recipe", ["strict", "bf16"])
def test_fused_rotary_engine_is_bitwise_the_unfused_one_and_the_learner(recipe, monkeypatch):
    rec = getattr(NVFP4Recipe, recipe)()
    torch.manual_seed(0)
    torch._dynamo.reset()
    learner = tiny_qwen3(layers=LAYERS, dtype=torch.bfloat16).eval()
    fused_counts: list[int] = []

    def counting(gm, recipe, report):
        fuse_rotary_into_norm_pairs(gm, recipe, report)
        fused_counts.append(report.counts.get("rotary_fused_into_norms", 0))

    full = passes.PIPELINE
    monkeypatch.setattr(
        passes, "PIPELINE", tuple(counting if p is fuse_rotary_into_norm_pairs else p for p in full)
    )
    fused = RolloutEngine(copy.deepcopy(learner), recipe=rec, max_batch=2, max_seq_len=16)
    out = _generate(fused)
    assert len(fused_counts) >= 2 and set(fused_counts) == {LAYERS}, fused_counts

    torch._dynamo.reset()
    monkeypatch.setattr(
        passes, "PIPELINE", tuple(p for p in full if p is not fuse_rotary_into_norm_pairs)
    )
    plain = RolloutEngine(copy.deepcopy(learner), recipe=rec, max_batch=2, max_seq_len=16)
    ref = _generate(plain)
    assert out.tokens == ref.tokens, recipe
    for i, (a, b) in enumerate(zip(out.logprobs, ref.logprobs)):
        assert_bitwise_equal(a, b, f"{recipe}: request {i}, with vs without the pass")

    monkeypatch.setattr(passes, "PIPELINE", full)
    torch._dynamo.reset()
    compiled = torch.compile(learner, backend="minite", options={"recipe": rec})
    seqs = [p + t for p, t in zip(PROMPTS, out.tokens)]
    with torch.no_grad():
        want = sequence_logprobs(compiled, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    for i, (a, b) in enumerate(zip(out.logprobs, want)):
        assert_bitwise_equal(a, b.cpu(), f"{recipe}: request {i}, rollout vs learner")
