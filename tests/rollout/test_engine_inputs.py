"""RolloutEngine's inputs: greedy decoding (temperature 0) is the learner's argmax and its
log-probs are the learner's unscaled ones, bitwise; bad prompts and export destinations are
refused with an error naming the argument, before anything runs or is written."""

import pytest
import torch

import fp4_compile
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rollout import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal


@pytest.fixture(scope="module")
def engine_and_model():
    torch.manual_seed(0)
    model = tiny_qwen3(layers=1).eval()
    engine = RolloutEngine(model, recipe=NVFP4Recipe.strict(), max_batch=4, max_seq_len=32)
    return engine, model


def test_greedy_is_the_learners_argmax_and_its_logprobs_bitwise(engine_and_model):
    engine, model = engine_and_model
    prompts = [[3, 5, 7], [11, 2]]
    out = engine.generate(prompts, max_new_tokens=6, temperature=0.0, seed=1)
    again = engine.generate(prompts, max_new_tokens=6, temperature=0.0, seed=99)
    assert out.tokens == again.tokens, "greedy decoding must not depend on the seed"
    learner = torch.compile(model, backend="minite", options={"recipe": NVFP4Recipe.strict()})
    seqs = [p + t for p, t in zip(prompts, out.tokens)]
    with torch.no_grad():
        ref = sequence_logprobs(learner, seqs, [len(p) for p in prompts], temperature=1.0)
        logits = learner(input_ids=torch.tensor([seqs[0]]), use_cache=False).logits[0]
    for i, (a, b) in enumerate(zip(out.logprobs, ref)):
        assert_bitwise_equal(a, b, f"greedy request {i}")
    picks = torch.argmax(logits[len(prompts[0]) - 1 : -1].float(), dim=-1).tolist()
    assert out.tokens[0] == picks


@pytest.mark.parametrize("bad", [-1, 10_000_000])
def test_out_of_vocabulary_prompt_token_is_named(engine_and_model, bad):
    engine, _ = engine_and_model
    with pytest.raises(ValueError, match=r"prompts\[1\]\[2\] = -?\d+ is not a token id"):
        engine.generate([[1, 2], [3, 4, bad]], max_new_tokens=2)


def test_negative_temperature_is_refused(engine_and_model):
    engine, _ = engine_and_model
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        engine.generate([[1, 2]], max_new_tokens=2, temperature=-0.5)


def test_export_refuses_a_foreign_non_empty_folder(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    model = tiny_qwen3(layers=1).eval()
    with pytest.raises(ValueError, match="non-empty folder that holds no minite rollout"):
        fp4_compile.export_rollout(model, path=foreign, max_batch=2, max_seq_len=16)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert (foreign / "notes.txt").read_text() == "keep me"
