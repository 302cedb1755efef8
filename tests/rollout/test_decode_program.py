"""The decode program (fp4_compile/rollout/decode_program.py): built once per (batch bucket,
sampling setting) and reused across generate calls and weight updates (on CUDA: one capture
each; on the CPU the same program runs eagerly, and the count is of programs built); padded rows
change no bit of the real rows; the device-side step counter draws the host step's noise."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine
from fp4_compile.rollout.decode_program import Sampling, pick_tokens
from fp4_compile.rollout.logprobs import token_logprobs
from fp4_compile.rollout.sampling import filter_logits, gumbel_noise, request_keys
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.strict()


def _prompts(num, seed, vocab=128):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def engine_and_model():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = tiny_qwen3(layers=1).eval()
    return RolloutEngine(model, recipe=RECIPE, max_batch=6, max_seq_len=32), model


def test_buckets():
    engine = RolloutEngine.__new__(RolloutEngine)
    engine.max_batch = 6
    assert [engine.bucket(n) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]


def test_one_program_per_bucket_across_calls_and_weight_updates(engine_and_model):
    engine, model = engine_and_model
    built = engine.programs_built
    sizes = [1, 3, 2, 4, 3, 1, 4, 2]
    for i, num in enumerate(sizes):
        engine.generate(_prompts(num, seed=i), max_new_tokens=5, seed=i)
        if i % 3 == 2:
            with torch.no_grad():
                model.model.layers[0].mlp.up_proj.weight.mul_(0.9)
            engine.update_weights(model)
    assert engine.programs_built - built == 3, "buckets 1, 4 and 2: one program each"
    engine.generate(_prompts(2, seed=0), max_new_tokens=5, temperature=0.0)
    assert engine.programs_built - built == 4, "another sampling setting: one more program"
    engine.generate(_prompts(1, seed=0), max_new_tokens=5, temperature=0.0)
    assert engine.programs_built - built == 5


def test_padded_rows_change_no_real_row(engine_and_model):
    """3 requests (bucket 4: one padded row) == the same 3 beside a 4th real request (no
    padding) == each alone (bucket 1); 5 requests in the capped bucket 6 likewise."""
    engine, _ = engine_and_model
    prompts = _prompts(5, seed=7)
    seeds = [40 + i for i in range(5)]
    kw = dict(max_new_tokens=8, temperature=1.0)
    padded = engine.generate(prompts[:3], seed=seeds[:3], **kw)
    full = engine.generate(prompts[:4], seed=seeds[:4], **kw)
    capped = engine.generate(prompts, seed=seeds, **kw)
    for i in range(3):
        alone = engine.generate([prompts[i]], seed=[seeds[i]], **kw)
        others = ((full, i, "beside a real row"), (capped, i, "in bucket 6"), (alone, 0, "alone"))
        for other, j, what in others:
            assert padded.tokens[i] == other.tokens[j], (i, what)
            assert_bitwise_equal(padded.logprobs[i], other.logprobs[j], f"request {i}, {what}")


@pytest.mark.parametrize(
    "sampling",
    [Sampling(1.0), Sampling(0.7), Sampling(0.9, top_k=5), Sampling(1.0, top_p=0.8), Sampling(0.0)],
)
def test_pick_tokens_equal_the_torch_form(sampling):
    """Contract (bitwise): the decode program's pick (`fp4_compile::sample_argmax`, which makes
    the seeded noise itself from the keys and draw numbers) == the torch form the program ran
    before: argmax(filter(logits.float() / T) + gumbel_noise(keys, n)) and the shared log-prob
    op at that token, for host, shared and per-row draw numbers; greedy: argmax(logits)."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(5, 97, generator=g) * 2).to(torch.bfloat16)
    keys = request_keys([5, 6, 7, 8, 9], "cpu")
    for n in (0, 7, torch.tensor(3), torch.tensor([0, 1, 4, 2**33, 9])):
        picked, logp = pick_tokens(logits, keys, n, sampling, 97)
        t = sampling.temperature
        if t == 0:
            want = torch.argmax(logits.float(), dim=-1)
        else:
            scaled = filter_logits(logits.float() / t, top_k=sampling.top_k, top_p=sampling.top_p)
            want = torch.argmax(scaled + gumbel_noise(keys, n, 97), dim=-1)
        assert_bitwise_equal(picked, want, f"picks at draw {n}")
        assert_bitwise_equal(logp, token_logprobs(logits, want, t or 1.0), f"log-probs at {n}")
