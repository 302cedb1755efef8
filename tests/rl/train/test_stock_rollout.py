"""The stock rollout engine (`rl/train/stock_rollout.py`) takes any number of requests, in static
waves of max_batch. Contracts, bitwise: one generate over more requests than max_batch returns
exactly (tokens and raw log-prob bytes) what one generate per wave of max_batch returns; a
per-request budget is the prefix of a longer one within the same wave; filters are refused."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl.train.stock_rollout import StockRolloutEngine
from fp4_compile.testing import assert_bitwise_equal

NUM, MAX_BATCH = 7, 3


def _prompts(num, seed, vocab=128):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


PROMPTS = _prompts(NUM, seed=5)
SEEDS = [40 + 3 * i for i in range(NUM)]


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    model = tiny_qwen3(layers=1).eval()
    return StockRolloutEngine(
        model, recipe=NVFP4Recipe.strict(), max_batch=MAX_BATCH, max_seq_len=24
    )


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_one_call_equals_one_call_per_wave(engine, temperature):
    kw = dict(max_new_tokens=8, temperature=temperature)
    whole = engine.generate(PROMPTS, seed=SEEDS, **kw)
    assert len(whole.tokens) == NUM
    for start in range(0, NUM, MAX_BATCH):
        wave = slice(start, start + MAX_BATCH)
        part = engine.generate(PROMPTS[wave], seed=SEEDS[wave], **kw)
        assert part.tokens == whole.tokens[wave]
        assert part.finish_reasons == whole.finish_reasons[wave]
        for i, (a, b) in enumerate(zip(part.logprobs, whole.logprobs[wave])):
            assert_bitwise_equal(a, b, f"t={temperature} request {start + i}")


def test_per_request_budgets_are_prefixes(engine):
    budgets = [1, 8, 3, 8, 5, 2, 8]
    short = engine.generate(PROMPTS, max_new_tokens=budgets, seed=SEEDS)
    long = engine.generate(PROMPTS, max_new_tokens=8, seed=SEEDS)
    assert [len(t) for t in short.tokens] == budgets
    for i, b in enumerate(budgets):
        assert short.tokens[i] == long.tokens[i][:b]
        assert_bitwise_equal(short.logprobs[i], long.logprobs[i][:b], f"request {i}")


def test_filters_are_refused_naming_them(engine):
    with pytest.raises(ValueError, match="top_k=4, top_p=1.0: no filter here"):
        engine.generate(PROMPTS, max_new_tokens=2, top_k=4)
