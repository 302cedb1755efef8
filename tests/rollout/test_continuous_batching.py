"""Continuous batching in RolloutEngine.generate (issue 54): any number of requests run in the
slots of one batch bucket; a finished request's slot (EOS or its own max_new_tokens) is refilled
with the next waiting request, prefilled alone into that slot's cache rows.

Tier: bitwise. Every request's tokens and log-probs (raw bytes) equal those it has generated
alone, whether it ran in a full static batch or was admitted mid-flight into a slot another
request left (its cache rows dirty), at max_batch 1, 2, 3 and 4 with more requests than
max_batch, ragged prompts, per-request budgets and EOS at varied steps. Also: per-request
max_new_tokens is honored (a shorter budget is the prefix of a longer one), and bad budgets are
refused naming the request.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.strict()
MAX_SEQ_LEN = 40
NUM = 9


def _prompts(num, seed, vocab=128):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


PROMPTS = _prompts(NUM, seed=3)
SEEDS = [100 + 7 * i for i in range(NUM)]
BUDGETS = [12, 3, 16, 1, 9, 14, 5, 16, 7]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    torch._dynamo.reset()
    return tiny_qwen3(layers=1).eval()


@pytest.fixture(scope="module")
def engines(model):
    """One engine per max_batch (1, 2, 3, 4), sharing the model."""
    return {
        k: RolloutEngine(model, recipe=RECIPE, max_batch=k, max_seq_len=MAX_SEQ_LEN)
        for k in (1, 2, 3, 4)
    }


@pytest.fixture(scope="module")
def eos(engines):
    """An EOS id that ends several requests at varied steps: the token drawn by the most
    requests, free-running, at temperature 0.7 (a sharper distribution: repeats are common)."""
    free = engines[4].generate(PROMPTS, max_new_tokens=BUDGETS, seed=SEEDS, temperature=0.7)
    counts = torch.zeros(128, dtype=torch.long)
    for row in free.tokens:
        counts[sorted(set(row))] += 1
    token = int(torch.argmax(counts))
    first = sorted({row.index(token) for row in free.tokens if token in row})
    assert len(first) >= 2, f"eos {token} should end requests at varied steps, got {first}"
    return token


@pytest.fixture(scope="module")
def alone(engines, eos):
    """Each request generated alone (a bucket-1 program in a zeroed cache), with and without
    the EOS id."""
    engine = engines[4]
    out = {}
    for use_eos in (False, True):
        for i in range(NUM):
            out[use_eos, i] = engine.generate(
                [PROMPTS[i]],
                max_new_tokens=BUDGETS[i],
                seed=[SEEDS[i]],
                temperature=0.7,
                eos_token_id=eos if use_eos else None,
            )
    return out


def _assert_equal_alone(out, alone, use_eos, what):
    for i in range(NUM):
        ref = alone[use_eos, i]
        assert out.tokens[i] == ref.tokens[0], (what, i)
        assert out.finish_reasons[i] == ref.finish_reasons[0], (what, i)
        assert_bitwise_equal(out.logprobs[i], ref.logprobs[0], f"{what}: request {i}")


@pytest.mark.parametrize("max_batch", [1, 2, 3, 4])
@pytest.mark.parametrize("use_eos", [False, True], ids=["budgets", "eos"])
def test_more_requests_than_max_batch_equal_each_alone(engines, eos, alone, max_batch, use_eos):
    """9 ragged requests with their own budgets (and an EOS id ending several of them at varied
    steps) through one generate call at max_batch 1-4: every slot is refilled mid-flight, and
    every request's tokens, finish reason and log-probs (bytes) equal its own run alone."""
    engine = engines[max_batch]
    out = engine.generate(
        PROMPTS,
        max_new_tokens=BUDGETS,
        seed=SEEDS,
        temperature=0.7,
        eos_token_id=eos if use_eos else None,
    )
    assert len(out.tokens) == NUM
    _assert_equal_alone(out, alone, use_eos, f"max_batch {max_batch}")
    if use_eos:
        reasons = out.finish_reasons
        assert "eos" in reasons and "length" in reasons, reasons
    else:
        assert [len(t) for t in out.tokens] == BUDGETS
        assert out.finish_reasons == ["length"] * NUM


def test_full_static_batch_and_request_order_change_no_bit(engines, eos, alone):
    """The first 4 requests as one full static batch (no refill), and all 9 in reverse order
    (other slot neighbours, other admission steps), equal each request alone."""
    engine = engines[4]
    kw = dict(temperature=0.7, eos_token_id=eos)
    static = engine.generate(PROMPTS[:4], max_new_tokens=BUDGETS[:4], seed=SEEDS[:4], **kw)
    for i in range(4):
        assert static.tokens[i] == alone[True, i].tokens[0], i
        assert_bitwise_equal(static.logprobs[i], alone[True, i].logprobs[0], f"static {i}")
    order = list(reversed(range(NUM)))
    rev = engine.generate(
        [PROMPTS[i] for i in order],
        seed=[SEEDS[i] for i in order],
        max_new_tokens=[BUDGETS[i] for i in order],
        **kw,
    )
    for j, i in enumerate(order):
        assert rev.tokens[j] == alone[True, i].tokens[0], i
        assert_bitwise_equal(rev.logprobs[j], alone[True, i].logprobs[0], f"reversed {i}")


def test_per_request_budgets_are_prefixes_of_longer_ones(engines):
    """Per-request max_new_tokens: each request gets exactly its budget (no EOS), and its
    tokens and log-probs are the prefix of the same request with a longer budget (one int for
    all), bitwise; greedy decoding too."""
    engine = engines[2]
    prompts = PROMPTS[:5]
    budgets = [2, 7, 1, 5, 3]
    for temperature in (1.0, 0.0):
        short = engine.generate(prompts, max_new_tokens=budgets, seed=11, temperature=temperature)
        long = engine.generate(prompts, max_new_tokens=8, seed=11, temperature=temperature)
        assert [len(t) for t in short.tokens] == budgets
        assert [len(t) for t in long.tokens] == [8] * 5
        for i, b in enumerate(budgets):
            assert short.tokens[i] == long.tokens[i][:b], (temperature, i)
            assert_bitwise_equal(short.logprobs[i], long.logprobs[i][:b], f"t={temperature} {i}")


def test_bad_budgets_are_refused_naming_the_request(engines):
    engine = engines[2]
    with pytest.raises(ValueError, match="max_new_tokens list has 1 entries for 2 prompts"):
        engine.generate([[1], [2]], max_new_tokens=[3])
    with pytest.raises(ValueError, match=r"max_new_tokens\[1\] must be an int >= 1"):
        engine.generate([[1], [2]], max_new_tokens=[3, 0])
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        engine.generate([[1], [2]], max_new_tokens=0)
    with pytest.raises(ValueError, match=r"prompt 2 \(5 tokens\) \+ max_new_tokens \(36\)"):
        engine.generate([[1], [2], [3] * 5], max_new_tokens=[39, 30, 36])
    with pytest.raises(ValueError, match=r"prompts\[3\]\[1\] = 128 is not a token id"):
        engine.generate([[1], [2], [3], [4, 128]], max_new_tokens=2)
