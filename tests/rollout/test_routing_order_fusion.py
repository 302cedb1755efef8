"""The rollout engine's routing fusion (`passes/fold_routing_order.py`): in its prefill and decode
graphs each MoE layer's top-k routing and expert_order run as ONE `fp4_compile::routing_order`.

Tier: bitwise. On the tiny Qwen3-MoE (strict recipe, CPU), an engine compiled with the pass
generates the same tokens and log-probs (raw bytes) as one compiled without it, continuously
batched; and its log-probs equal the learner's sequence log-probs computed in a training
(grad-enabled) forward, whose graph keeps the two ops. Counts: one fold per layer in every engine
graph, none in the learner's.
"""

import torch

from fp4_compile import NVFP4Recipe, passes
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.passes.fold_routing_order import fold_routing_order
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.strict()
LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8], [1, 2, 3, 4]]
BUDGETS = [6, 2, 5, 4, 3]
TEMPERATURE = 0.8


def _pipeline(monkeypatch, *, fold: bool, folds: list[int]):
    """PIPELINE with fold_routing_order (recording each graph's folds) or without it."""

    def recorded(gm, recipe, report):
        fold_routing_order(gm, recipe, report)
        folds.append(report.counts.get("routing_order_folded", 0))

    steps = [
        recorded if p is fold_routing_order else p
        for p in passes.PIPELINE
        if fold or p is not fold_routing_order
    ]
    monkeypatch.setattr(passes, "PIPELINE", tuple(steps))


def _generate(model, monkeypatch, *, fold: bool):
    folds: list[int] = []
    _pipeline(monkeypatch, fold=fold, folds=folds)
    torch._dynamo.reset()
    engine = RolloutEngine(model, recipe=RECIPE, max_batch=2, max_seq_len=24)
    out = engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)
    monkeypatch.undo()
    return out, folds


def test_fused_routing_is_bitwise_the_two_ops_and_the_learner(monkeypatch):
    torch.manual_seed(0)
    model = tiny_qwen3_moe(layers=LAYERS).eval()
    fused, folds = _generate(model, monkeypatch, fold=True)
    plain, no_folds = _generate(model, monkeypatch, fold=False)
    assert len(folds) >= 2 and set(folds) == {LAYERS}, folds  # prefill and decode graphs
    assert no_folds == []
    assert fused.tokens == plain.tokens
    for i, (a, b) in enumerate(zip(fused.logprobs, plain.logprobs)):
        assert len(a) == BUDGETS[i]
        assert_bitwise_equal(a, b, f"request {i}: pass on vs off")

    learner_folds: list[int] = []
    _pipeline(monkeypatch, fold=True, folds=learner_folds)
    torch._dynamo.reset()
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    seqs = [p + t for p, t in zip(PROMPTS, fused.tokens)]
    with torch.enable_grad():  # the training forward: the routing's backward is kept
        ref = sequence_logprobs(learner, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    assert learner_folds and set(learner_folds) == {0}, learner_folds
    for i, (a, b) in enumerate(zip(fused.logprobs, ref)):
        assert_bitwise_equal(a, b.detach().cpu(), f"request {i}: rollout vs learner")
    torch._dynamo.reset()
