"""The rollout engine's BF16 group linear fusion (a recipe with quantize=False:
`WeightStore.make_linear_groups`, `rollout/bf16_groups.py`, `passes/fuse_group_linears.py`):
q/k/v and gate/up each run as ONE `invariant_linear` over the group's BF16 buffer, which the
members' parameters are views of, in the prefill and decode graphs.

Tier: bitwise. On tiny Qwen3 (bf16 recipe, CPU; FP32 masters, whose weights the graph casts,
and BF16 masters, read as they are), an engine with fuse_groups on generates the same tokens
and the same log-probs (raw bytes) as one with it off, continuously batched (more requests than
max_batch), before and after `update_weights` with changed learner weights (copied into the
parameters, so into the buffers), and its log-probs equal the learner's sequence log-probs bit
for bit. Counts: two groups per layer fused in each compiled graph, none with it off; the
weights are held once (the parameters are row ranges of the buffers).
"""

import copy

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.bf16()
LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8], [1, 2, 3, 4]]
BUDGETS = [6, 2, 5, 4, 3]
TEMPERATURE = 0.8


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
    """An in-place AdamW step changing every matrix."""
    params = [p for p in model.parameters() if p.dim() >= 2]
    for p in params:
        p.grad = torch.randn_like(p)
    torch.optim.AdamW(params, lr=0.05).step()
    for p in params:
        p.grad = None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_group_linears_are_bitwise_the_separate_ones_and_the_learner(dtype):
    torch.manual_seed(0)
    torch._dynamo.reset()
    learner = tiny_qwen3(layers=LAYERS, dtype=dtype).eval()
    fused = RolloutEngine(copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=24)
    plain = RolloutEngine(copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=24)
    plain.weight_store.fuse_groups = False
    assert fused.weight_store.fuse_groups, "the engine's store fuses by default"
    store = fused.weight_store
    assert len(store.linear_groups) == 5 * LAYERS, "q/k/v and gate/up of each layer"
    for name, g in store.linear_groups.items():  # held once: the parameter is the buffer's rows
        p = store.params[name]
        assert p.untyped_storage().data_ptr() == g.buffer.untyped_storage().data_ptr(), name
        assert torch.equal(p, g.buffer[g.start : g.start + g.rows]), name

    before = _generate(fused)
    _assert_same(before, _generate(plain), "before the update")
    graphs, rest = divmod(store.groups_fused, 2 * LAYERS)
    assert graphs >= 2 and rest == 0, store.groups_fused
    assert plain.weight_store.groups_fused == 0
    _assert_learner_equal(learner, before, "before the update")

    _step(learner)
    fused.update_weights(learner)
    plain.update_weights(learner)
    after = _generate(fused)
    assert after.tokens != before.tokens, "the update must change the rollout (else no test)"
    _assert_same(after, _generate(plain), "after update_weights")
    _assert_learner_equal(learner, after, "after update_weights")
