"""The alignment chain (strict recipe), bitwise: rollout engine log-probs == the learner's
sequence log-probs, for mixed prompt lengths, several batch sizes and temperatures; the same
request alone vs inside a batch gives identical tokens and log-probs. Any differing bit fails."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

NEW_TOKENS = 32


def _prompts(num, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe"])
def setup(request):
    model = (tiny_qwen3 if request.param == "qwen3" else tiny_qwen3_moe)(layers=2).eval()
    recipe = NVFP4Recipe.strict()
    engine = RolloutEngine(model, recipe=recipe, max_batch=32, max_seq_len=64)
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    return model, engine, learner


@pytest.mark.parametrize("batch", [1, 3, 8, 32])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_learner_bitwise(setup, batch, temperature):
    model, engine, learner = setup
    prompts = _prompts(batch, model.config.vocab_size, seed=batch)
    out = engine.generate(prompts, max_new_tokens=NEW_TOKENS, temperature=temperature, seed=100)
    seqs = [p + t for p, t in zip(prompts, out.tokens)]
    with torch.no_grad():
        ref = sequence_logprobs(learner, seqs, [len(p) for p in prompts], temperature=temperature)
    for i, (a, b) in enumerate(zip(out.logprobs, ref)):
        assert len(out.tokens[i]) == NEW_TOKENS
        assert_bitwise_equal(a, b.cpu(), f"request {i} of {batch} (T={temperature})")


def test_alone_equals_in_batch(setup):
    model, engine, _ = setup
    prompts = _prompts(8, model.config.vocab_size, seed=5)
    batch = engine.generate(
        prompts, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=[11 + i for i in range(8)]
    )
    for i in (0, 3, 7):
        alone = engine.generate(
            [prompts[i]], max_new_tokens=NEW_TOKENS, temperature=1.0, seed=[11 + i]
        )
        assert alone.tokens[0] == batch.tokens[i]
        assert_bitwise_equal(alone.logprobs[0], batch.logprobs[i], f"request {i} alone vs in batch")


def test_shared_weight_scale_off_still_aligns():
    """The recipe with shared_weight_scale=False (every weight its own global scale): rollout
    engine log-probs == the learner's, bitwise, like the default."""
    model = tiny_qwen3(layers=1).eval()
    recipe = NVFP4Recipe.strict(shared_weight_scale=False)
    engine = RolloutEngine(model, recipe=recipe, max_batch=4, max_seq_len=32)
    torch._dynamo.reset()
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    prompts = _prompts(3, model.config.vocab_size, seed=9)
    out = engine.generate(prompts, max_new_tokens=8, temperature=1.0, seed=100)
    seqs = [p + t for p, t in zip(prompts, out.tokens)]
    with torch.no_grad():
        ref = sequence_logprobs(learner, seqs, [len(p) for p in prompts], temperature=1.0)
    for i, (a, b) in enumerate(zip(out.logprobs, ref)):
        assert_bitwise_equal(a, b.cpu(), f"request {i} (shared_weight_scale=False)")
