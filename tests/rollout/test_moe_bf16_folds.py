"""The bf16 recipe's MoE experts in the rollout engine: the tokens' gather read by the grouped
GEMM's operand load (`invariant_grouped_mm(..., x_index)`, `passes/fold_expert_gathers.py`) and
q/k/v as one linear (`passes/fuse_group_linears.py`).

Tier: bitwise. On tiny Qwen3-MoE (BF16 masters, CPU), an engine whose graphs fold the gather
generates the same tokens and log-probs (raw bytes) as one whose graphs keep `gather_rows`,
continuously batched, before and after `update_weights`, and its log-probs equal the learner's
sequence log-probs (the learner's forward folds too; the op's backward is the unfolded graph's:
tests/codegen/moe/test_grouped_mm_gathered.py). Counts: one fold per layer per compiled graph.
"""

import copy
import importlib
from unittest import mock

import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.bf16()
LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]]
BUDGETS = [5, 2, 4, 3]
TEMPERATURE = 0.8
# the pass's module (the package names the pass function alike)
folds = importlib.import_module("fp4_compile.passes.fold_expert_gathers")


def _generate(engine):
    return engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)


def _assert_same(a, b, what):
    assert a.tokens == b.tokens, what
    for i, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
        assert_bitwise_equal(x, y, f"{what}: request {i}")


def _assert_learner_equal(model, out, what):
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    seqs = [p + t for p, t in zip(PROMPTS, out.tokens)]
    with torch.no_grad():
        ref = sequence_logprobs(learner, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE)
    for i, (a, b) in enumerate(zip(out.logprobs, ref)):
        assert_bitwise_equal(a, b.cpu(), f"{what}: request {i}, rollout vs learner")


def _step(model):
    params = [p for p in model.parameters() if p.dim() >= 2]
    for p in params:
        p.grad = torch.randn_like(p)
    torch.optim.AdamW(params, lr=0.05).step()
    for p in params:
        p.grad = None


def test_folded_expert_gather_is_bitwise_the_gather_and_the_learner():
    torch.manual_seed(0)
    torch._dynamo.reset()
    learner = tiny_qwen3_moe(layers=LAYERS, dtype=torch.bfloat16).eval()
    folded = RolloutEngine(copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=24)
    plain = RolloutEngine(copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=24)
    made = []
    fold = folds._fold_bf16

    def counted(graph, node, report):
        fold(graph, node, report)
        made.append(node not in list(graph.nodes))

    with mock.patch.object(folds, "_fold_bf16", counted):
        before = _generate(folded)
    graphs, rest = divmod(sum(made), LAYERS)
    assert graphs >= 2 and rest == 0, made  # prefill and decode graphs, gate_up's input each
    with mock.patch.object(folds, "_fold_bf16", lambda graph, node, report: None):
        _assert_same(before, _generate(plain), "before the update")
    assert folded.weight_store.groups_fused > 0, "q/k/v as one linear"
    _assert_learner_equal(learner, before, "before the update")

    _step(learner)
    folded.update_weights(learner)
    plain.update_weights(learner)
    after = _generate(folded)
    assert after.tokens != before.tokens, "the update must change the rollout (else no test)"
    _assert_same(after, _generate(plain), "after update_weights")
    _assert_learner_equal(learner, after, "after update_weights")
