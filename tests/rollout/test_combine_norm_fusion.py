"""The rollout engine with each MoE block's top-k combine folded into the residual add + RMSNorm
after it (`passes/fuse_combine_into_norms.py`, in PIPELINE) against the same engine without the
pass.

Tier: bitwise. On the tiny Qwen3-MoE in bf16 (the pass fuses bf16 inference graphs; CPU: the
op is the composition of the two ops' references), under the bf16 and the strict recipes, an
engine with the pass generates the same tokens and log-probs (raw bytes) as one without it,
continuously batched (more requests than max_batch); its log-probs equal the learner's sequence
log-probs computed in a training (grad-enabled) forward, whose graph keeps the two ops. Counts:
bf16, one fusion per layer in every engine graph (layer i's combine into layer i+1's input
norm, the last one's into the final norm); strict, one (the last layer's: the final norm is a
bf16 norm, the others quantize); none in the learner's graph.
"""

import copy

import pytest
import torch

from fp4_compile import NVFP4Recipe, passes
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.passes.fuse_combine_into_norms import fuse_combine_into_norms
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8], [1, 2, 3, 4]]
BUDGETS = [6, 2, 5, 4, 3]
TEMPERATURE = 0.8


def _pipeline(monkeypatch, *, fuse: bool, counts: list[int]):
    """PIPELINE with fuse_combine_into_norms (recording each graph's fusions) or without it."""

    def recorded(gm, recipe, report):
        fuse_combine_into_norms(gm, recipe, report)
        counts.append(report.counts.get("combine_fused_into_norm", 0))

    steps = [
        recorded if p is fuse_combine_into_norms else p
        for p in passes.PIPELINE
        if fuse or p is not fuse_combine_into_norms
    ]
    monkeypatch.setattr(passes, "PIPELINE", tuple(steps))


def _generate(model, recipe, monkeypatch, *, fuse: bool):
    counts: list[int] = []
    _pipeline(monkeypatch, fuse=fuse, counts=counts)
    torch._dynamo.reset()
    engine = RolloutEngine(copy.deepcopy(model), recipe=recipe, max_batch=2, max_seq_len=24)
    out = engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)
    monkeypatch.undo()
    return out, counts


@pytest.mark.parametrize(("recipe", "per_graph"), [("bf16", LAYERS), ("strict", 1)])
def test_fused_combine_is_bitwise_the_two_ops_and_the_learner(recipe, per_graph, monkeypatch):
    rec = getattr(NVFP4Recipe, recipe)()
    torch.manual_seed(0)
    model = tiny_qwen3_moe(layers=LAYERS, dtype=torch.bfloat16).eval()
    fused, counts = _generate(model, rec, monkeypatch, fuse=True)
    plain, no_counts = _generate(model, rec, monkeypatch, fuse=False)
    assert len(counts) >= 2 and set(counts) == {per_graph}, counts  # prefill and decode graphs
    assert no_counts == []
    assert fused.tokens == plain.tokens
    for i, (a, b) in enumerate(zip(fused.logprobs, plain.logprobs)):
        assert len(a) == BUDGETS[i]
        assert_bitwise_equal(a, b, f"request {i}: pass on vs off")

    learner_counts: list[int] = []
    _pipeline(monkeypatch, fuse=True, counts=learner_counts)
    torch._dynamo.reset()
    learner = torch.compile(model, backend="minite", options={"recipe": rec})
    seqs = [p + t for p, t in zip(PROMPTS, fused.tokens)]
    with torch.enable_grad():  # the training forward: the combine's backward is kept
        ref = sequence_logprobs(learner, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    assert learner_counts and set(learner_counts) == {0}, learner_counts
    for i, (a, b) in enumerate(zip(fused.logprobs, ref)):
        assert_bitwise_equal(a, b.detach().cpu(), f"request {i}: rollout vs learner")
    torch._dynamo.reset()
