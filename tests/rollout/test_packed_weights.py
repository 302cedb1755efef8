"""RolloutEngine(weights="packed") (fp4_compile/rollout/packed_weights.py, issue 54): the engine
keeps only what its compiled step reads.

Tier: bitwise. A packed engine's tokens and log-probs (raw bytes) equal the default
("bf16+packed") engine's, continuously batched (more requests than max_batch: admissions
mid-flight), in a second bucket compiled after the release, and after `update_weights` with
changed learner weights, on tiny Qwen3 and tiny Qwen3-MoE, strict recipe, CPU; an exported
artifact's engine too. Memory: every parameter the store quantizes holds 0 storage bytes (shape
kept), and `weight_bytes()` is the default engine's less exactly those parameters' bytes, before
and after an update (no BF16 copy kept). Refusals name the option.
"""

import copy

import pytest
import torch

import fp4_compile
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine
from fp4_compile.rollout.weight_store import released_storage
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.strict()
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8], [1, 2, 3, 4]]
BUDGETS = [6, 2, 5, 4, 3]


def _generate(engine, prompts=PROMPTS, budgets=BUDGETS):
    return engine.generate(prompts, max_new_tokens=budgets, seed=3, temperature=0.8)


def _assert_same(a, b, what):
    assert a.tokens == b.tokens, what
    for i, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
        assert_bitwise_equal(x, y, f"{what}: request {i}")


def _step(model):
    """An in-place AdamW step changing every matrix (embeddings and head included)."""
    params = [p for p in model.parameters() if p.dim() >= 2]
    for p in params:
        p.grad = torch.randn_like(p)
    torch.optim.AdamW(params, lr=0.05).step()
    for p in params:
        p.grad = None


def _bytes(t):
    return t.numel() * t.element_size()


def _assert_released(engine):
    store = engine.weight_store
    assert store.entries, "premise: the store holds weights"
    for name, p in store.params.items():
        assert released_storage(p) == (name in store.entries), name
        if name in store.entries:
            assert p.untyped_storage().nbytes() == 0 and p.numel() > 0, name


@pytest.mark.parametrize("build", [tiny_qwen3, tiny_qwen3_moe], ids=["qwen3", "qwen3_moe"])
def test_packed_engine_is_bitwise_the_default_before_and_after_an_update(build):
    torch.manual_seed(0)
    torch._dynamo.reset()
    learner = build(layers=1).eval()
    default = RolloutEngine(copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=24)
    packed = RolloutEngine(
        copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=24, weights="packed"
    )
    assert packed.weight_bytes() == default.weight_bytes(), "nothing released before a compile"
    before = _generate(default)
    _assert_same(before, _generate(packed), "before the update")
    _assert_released(packed)
    released = sum(_bytes(packed.weight_store.params[n]) for n in packed.weight_store.entries)
    assert packed.weight_bytes() == default.weight_bytes() - released
    held = packed.weight_bytes()
    # a new bucket (batch 1): a compile after the release
    _assert_same(_generate(default, [[9, 9]], 5), _generate(packed, [[9, 9]], 5), "bucket 1")

    _step(learner)
    default.update_weights(learner)
    packed.update_weights(learner)
    after = _generate(default)
    assert after.tokens != before.tokens, "the update must change the rollout (else no test)"
    _assert_same(after, _generate(packed), "after update_weights")
    _assert_released(packed)
    assert packed.weight_bytes() == held, "the update keeps no BF16 copy"
    for name, entry in packed.weight_store.entries.items():
        codes = default.weight_store.entries[name].codes
        assert torch.equal(entry.codes.view(torch.uint8), codes.view(torch.uint8)), name


def test_packed_artifact_engine_is_bitwise_the_default(tmp_path):
    torch.manual_seed(0)
    torch._dynamo.reset()
    learner = tiny_qwen3(layers=1).eval()
    path = tmp_path / "rollout"
    fp4_compile.export_rollout(learner, recipe=RECIPE, path=path, max_batch=2, max_seq_len=24)
    default = RolloutEngine(path, expected_fingerprint=RECIPE.fingerprint())
    packed = RolloutEngine(path, expected_fingerprint=RECIPE.fingerprint(), weights="packed")
    _assert_released(packed)  # bound at construction: released there
    released = sum(_bytes(packed.weight_store.params[n]) for n in packed.weight_store.entries)
    assert packed.weight_bytes() == default.weight_bytes() - released
    before = _generate(default)
    _assert_same(before, _generate(packed), "artifact, before the update")
    _step(learner)
    default.update_weights(learner)
    packed.update_weights(learner)
    after = _generate(default)
    assert after.tokens != before.tokens, "the update must change the rollout (else no test)"
    _assert_same(after, _generate(packed), "artifact, after update_weights")


def test_a_released_parameter_is_never_read():
    """The store refuses to quantize from released storage (by name) instead of reading it."""
    torch._dynamo.reset()
    engine = RolloutEngine(
        tiny_qwen3(layers=1).eval(), recipe=RECIPE, max_batch=1, max_seq_len=16, weights="packed"
    )
    engine.generate([[1, 2]], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"q_proj.weight.*released"):
        engine.weight_store.refresh()


def test_refusals_name_the_option():
    model = tiny_qwen3(layers=1).eval()
    with pytest.raises(ValueError, match="weights must be one of"):
        RolloutEngine(model, recipe=RECIPE, weights="nvfp4")
    with pytest.raises(ValueError, match="weights='packed' needs compile=True"):
        RolloutEngine(model, recipe=RECIPE, compile=False, weights="packed")
    with pytest.raises(ValueError, match="weights='packed'.*quantize=False"):
        RolloutEngine(model, recipe=NVFP4Recipe.bf16(), weights="packed")
    learner = tiny_qwen3(layers=1)
    next(learner.parameters()).grad = torch.zeros_like(next(learner.parameters()))
    with pytest.raises(ValueError, match="weights='packed'.*learner's.*gradient"):
        RolloutEngine(learner, recipe=RECIPE, weights="packed")
    store_learner = tiny_qwen3(layers=1)
    compiled = fp4_compile.compile(store_learner, recipe=RECIPE, quantize_weights="on_change")
    with pytest.raises(ValueError, match="weights='packed'.*learner's.*weight store"):
        RolloutEngine(store_learner, recipe=RECIPE, weights="packed")
    del compiled
    engine = RolloutEngine(model, recipe=RECIPE, weights="packed")
    with pytest.raises(ValueError, match="weights='packed'.*not the engine's own"):
        engine.update_weights(model)
