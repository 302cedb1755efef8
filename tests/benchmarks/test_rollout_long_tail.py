"""The long-tail rollout benchmark (benchmarks/rollout_long_tail.py), on the CPU at a tiny size.

Contracts: the response lengths are the stated distribution (lognormal, capped at the budget,
at least 1, the same for the same seed); continuous and static batching give every request the
same tokens and log-probs (bitwise), honor each request's length, and continuous batching runs
fewer decode steps than static batching on a long-tailed batch."""

import torch

from benchmarks import rollout_long_tail as lt
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rollout import RolloutEngine


def test_lengths_are_lognormal_capped_at_the_budget():
    lengths = lt.long_tail_lengths(4000, 64, median_frac=0.125, sigma=1.0, seed=0)
    assert lengths == lt.long_tail_lengths(4000, 64, median_frac=0.125, sigma=1.0, seed=0)
    assert min(lengths) >= 1 and max(lengths) == 64
    assert sorted(lengths)[2000] == 8  # the median: 0.125 x 64
    assert 0.01 < sum(n == 64 for n in lengths) / 4000 < 0.05  # P(z > log 8) = 0.019


def test_continuous_equals_static_bitwise_in_fewer_steps():
    torch.manual_seed(0)
    model = tiny_qwen3(layers=1).eval()
    engine = RolloutEngine(model, recipe=NVFP4Recipe.strict(), max_batch=2, max_seq_len=32)
    lengths = [1, 9, 2, 1, 8, 1]
    prompts = lt.make_prompts(len(lengths), 128, seed=0)
    seeds = list(range(len(lengths)))
    r = lt.measure(engine, prompts, lengths, seeds, reps=1)
    assert r["bitwise_equal"]
    # continuous: slot 1 runs request 1 (8 steps) while slot 0 runs 0, 2, 3, 4 (0 + 1 + 0 + 7)
    assert r["decode_steps"] == {"continuous": 8, "static": 8 + 1 + 7}, r["decode_steps"]
    out = lt.run_continuous(engine, prompts, lengths, seeds)
    assert [len(t) for t in out.tokens] == lengths
