"""RolloutEngine(kv_cache="paged") (issue 54 item 2): KV memory sized in tokens, a pool of pages
shared by the rows of the batch bucket, each row's keys read through its block table.

Tier: bitwise. Every request's tokens, finish reason and log-probs (raw bytes) equal the static
cache's (`kv_cache="static"`, the default) at the same max_batch: ragged prompts, per-request
budgets with a long tail (one request fills the whole max_seq_len), EOS at varied steps,
continuous batching with mid-flight admission, at max_batch 2, 3 and 4, from a pool far smaller
than max_batch x max_seq_len (requests wait for pages; a running request that cannot grow
restarts the youngest, which changes none of its bits). Also: a request that could never fit
the pool is refused before any work, naming the setting; the options are checked.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine
from fp4_compile.testing import assert_bitwise_equal

RECIPE = NVFP4Recipe.strict()
MAX_SEQ_LEN = 40
PAGE = 16  # a multiple of the CPU attention's key block
POOL_TOKENS = 48  # 3 pages (+ the scratch page): under 2 x 40 slots, the smallest bucket's
MAX_BATCHES = (2, 3, 4)


def _prompts(num, seed, vocab=128):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


PROMPTS = _prompts(10, seed=3)
PROMPTS[7] = PROMPTS[7][:6] + [5] * (6 - len(PROMPTS[7]))  # 6 tokens: 6 + 34 = MAX_SEQ_LEN
SEEDS = [100 + 7 * i for i in range(10)]
BUDGETS = [12, 3, 16, 1, 9, 14, 5, 34, 7, 2]  # long-tailed: request 7 takes every slot


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    torch._dynamo.reset()
    return tiny_qwen3(layers=1).eval()


def _engine(model, max_batch, **kv):
    return RolloutEngine(model, recipe=RECIPE, max_batch=max_batch, max_seq_len=MAX_SEQ_LEN, **kv)


@pytest.fixture(scope="module")
def engines(model):
    """(static, paged) engines per max_batch; the paged pool holds POOL_TOKENS tokens."""
    return {
        k: (
            _engine(model, k),
            _engine(model, k, kv_cache="paged", kv_tokens=POOL_TOKENS, kv_page_size=PAGE),
        )
        for k in MAX_BATCHES
    }


@pytest.fixture(scope="module")
def eos(engines):
    """An EOS id that ends several requests at varied steps (the token drawn by the most
    requests, free-running at temperature 0.7)."""
    free = engines[4][0].generate(PROMPTS, max_new_tokens=BUDGETS, seed=SEEDS, temperature=0.7)
    counts = torch.zeros(128, dtype=torch.long)
    for row in free.tokens:
        counts[sorted(set(row))] += 1
    token = int(torch.argmax(counts))
    first = sorted({row.index(token) for row in free.tokens if token in row})
    assert len(first) >= 2, f"eos {token} should end requests at varied steps, got {first}"
    return token


def _assert_same(got, want, what):
    assert len(got.tokens) == len(want.tokens)
    for i in range(len(want.tokens)):
        assert got.tokens[i] == want.tokens[i], (what, i)
        assert got.finish_reasons[i] == want.finish_reasons[i], (what, i)
        assert_bitwise_equal(got.logprobs[i], want.logprobs[i], f"{what}: request {i}")


@pytest.mark.parametrize("max_batch", MAX_BATCHES)
@pytest.mark.parametrize("use_eos", [False, True], ids=["budgets", "eos"])
def test_paged_equals_static_with_a_small_pool(engines, eos, max_batch, use_eos):
    """10 ragged, long-tailed requests through one generate call: the paged engine (a pool of 3
    pages of 16 tokens, less than max_batch x max_seq_len; request 7 alone fills it) gives every request the static
    engine's tokens, finish reason and log-probs, bitwise."""
    static, paged = engines[max_batch]
    assert paged.kv_cache_bytes(max_batch) < static.kv_cache_bytes(max_batch)
    kw = dict(
        max_new_tokens=BUDGETS, seed=SEEDS, temperature=0.7, eos_token_id=eos if use_eos else None
    )
    want = static.generate(PROMPTS, **kw)
    got = paged.generate(PROMPTS, **kw)
    _assert_same(got, want, f"max_batch {max_batch}, eos {use_eos}")
    if not use_eos:
        assert [len(t) for t in got.tokens] == BUDGETS


def test_a_full_pool_restarts_the_youngest_request_and_changes_no_bit(engines, model):
    """At max_batch 4 the 3-page pool cannot hold every running request to its end: a request
    that cannot grow restarts the youngest running one (its pages freed, itself requeued
    first). The restarted requests' bits are unchanged (the last test); here: it happened, and
    a reversed order (other neighbours, other restarts) changes no bit either."""
    static, paged = engines[4]
    before = paged.kv_preemptions
    kw = dict(max_new_tokens=BUDGETS, seed=SEEDS, temperature=1.0)
    want = static.generate(PROMPTS, **kw)
    got = paged.generate(PROMPTS, **kw)
    _assert_same(got, want, "temperature 1")
    assert paged.kv_preemptions > before, "the 3-page pool should have forced a restart"
    order = list(reversed(range(len(PROMPTS))))
    rev = paged.generate(
        [PROMPTS[i] for i in order],
        max_new_tokens=[BUDGETS[i] for i in order],
        seed=[SEEDS[i] for i in order],
        temperature=1.0,
    )
    for j, i in enumerate(order):
        assert rev.tokens[j] == want.tokens[i], i
        assert_bitwise_equal(rev.logprobs[j], want.logprobs[i], f"reversed {i}")


def test_greedy_and_one_int_budget(engines):
    static, paged = engines[3]
    kw = dict(max_new_tokens=9, seed=5, temperature=0.0)
    _assert_same(paged.generate(PROMPTS, **kw), static.generate(PROMPTS, **kw), "greedy")


def test_a_request_the_pool_cannot_hold_is_refused_naming_the_setting(model):
    """A pool of 2 pages of 16 tokens cannot hold request 7 (6 + 34 - 1 = 39 positions: 3
    pages): refused before any work, naming kv_tokens; a pool sized by memory names
    kv_memory_bytes."""
    engine = _engine(model, 2, kv_cache="paged", kv_tokens=32, kv_page_size=PAGE)
    with pytest.raises(
        ValueError, match=r"request 7 .* needs 3 KV pages .* has 2 \(kv_tokens=32\)"
    ):
        engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=SEEDS)
    assert engine.decode_steps == 0
    per_token = engine.kv_cache_bytes(1) // (3 * PAGE)  # 2 pages + the scratch page
    budget = 3 * PAGE * per_token  # 3 pages: 2 usable
    engine = _engine(model, 2, kv_cache="paged", kv_memory_bytes=budget, kv_page_size=PAGE)
    assert engine.kv_cache_bytes(2) == budget
    with pytest.raises(ValueError, match=rf"has 2 \(kv_memory_bytes={budget}\)"):
        engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=SEEDS)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(kv_cache="pages"), "kv_cache must be one of"),
        (dict(kv_tokens=64), "pass kv_cache='paged'"),
        (dict(kv_cache="paged"), "needs one of kv_tokens or kv_memory_bytes"),
        (dict(kv_cache="paged", kv_tokens=64, kv_memory_bytes=10**6), "needs one of kv_tokens"),
        (dict(kv_cache="paged", kv_tokens=64, kv_page_size=8), "kv_page_size must be a positive"),
        (dict(kv_cache="paged", kv_tokens=0), "kv_tokens must be an int > 0"),
        (dict(kv_cache="paged", kv_memory_bytes=1), "holds no page"),
    ],
)
def test_kv_cache_options_are_checked(model, kw, match):
    with pytest.raises(ValueError, match=match):
        _engine(model, 2, **kw)
