"""benchmarks.kv_capacity's arithmetic (CPU, shapes only), and its engine rows against what
`RolloutEngine.weight_bytes()` reports at a tiny shape."""

import math

import pytest
import torch

from benchmarks.kv_capacity import kv_bytes_per_token, mean_response, weight_bytes, weight_forms
from benchmarks.rollout_long_tail import long_tail_lengths
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine


def test_mean_response_matches_the_long_tail_draws():
    budget, frac, sigma = 512, 0.125, 1.0
    drawn = long_tail_lengths(200_000, budget, median_frac=frac, sigma=sigma, seed=0)
    sample = float(torch.as_tensor(drawn, dtype=torch.float64).mean())
    assert mean_response(budget, frac, sigma) == pytest.approx(sample, rel=0.01)


def test_kv_bytes_per_token_of_qwen3_8b():
    # 36 layers x (K and V) x 8 KV heads x head_dim 128 x 2 bytes (BF16)
    assert kv_bytes_per_token("qwen3-8b") == 36 * 2 * 8 * 128 * 2


def test_nvfp4_weights_are_the_packed_bytes_plus_the_bf16_rest():
    w = weight_bytes("qwen3-8b")
    # a Qwen3-8B decoder layer: q 4096x4096, k/v 1024x4096 each, o 4096x4096, MLP 3 x 12288x4096
    gemm = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 12288 * 4096
    # NVFP4: 0.5 byte per value + one E4M3 scale per 16 values (+ a few bytes of global decode)
    assert w["per_layer"]["packed"] == pytest.approx(gemm * (0.5 + 1 / 16), rel=1e-4)
    assert w["per_layer"]["bf16"] == pytest.approx(2 * gemm, rel=1e-3)  # + norms
    assert w["bf16"] / w["nvfp4"] == pytest.approx(16.4 / 6.4, rel=0.02)
    assert not math.isclose(w["minite_engine_default"], w["nvfp4"])
    assert w["minite_engine_packed"] == w["nvfp4"]


@pytest.mark.parametrize("build", [tiny_qwen3, tiny_qwen3_moe], ids=["qwen3", "qwen3_moe"])
def test_engine_rows_are_what_the_engines_hold(build):
    """The two engine rows at a tiny 2-layer shape, in BF16 as the benchmark's models: the
    bytes `RolloutEngine.weight_bytes()` reports after a generate (its store filled), for the
    default engine and the packed-only one (== the NVFP4 row)."""
    forms = weight_forms(lambda n: build(layers=n, dtype=torch.bfloat16).to("meta"), layers=2)
    torch._dynamo.reset()
    held = {}
    for weights in ("bf16+packed", "packed"):
        engine = RolloutEngine(
            build(layers=2, dtype=torch.bfloat16).eval(),
            recipe=NVFP4Recipe.strict(),
            max_batch=1,
            max_seq_len=8,
            weights=weights,
        )
        engine.generate([[1, 2, 3]], max_new_tokens=2)
        held[weights] = engine.weight_bytes()
    assert held["bf16+packed"] == forms["minite_engine_default"]
    assert held["packed"] == forms["minite_engine_packed"] == forms["nvfp4"]


def test_paged_request_tokens_are_whole_pages_reserved_ahead():
    """A paged request holds its prompt and response in whole pages, reserved RESERVE_AHEAD
    tokens ahead (the engine's host-check interval): between the exact mean length and that
    plus a page and the reservation; one-token pages, no long tail: exactly the reservation."""
    from benchmarks.kv_capacity import RESERVE_AHEAD, mean_paged_tokens
    from fp4_compile.rollout import engine

    assert RESERVE_AHEAD == engine._EOS_CHECK_EVERY
    budget, frac, sigma = 8192, 0.125, 1.0
    exact = 1024 + mean_response(budget, frac, sigma)
    paged = mean_paged_tokens(1024, budget, frac, sigma, page=64)
    assert exact < paged < exact + 64 + RESERVE_AHEAD
    # responses all 64 (sigma ~ 0, median 64 of 512): 10 + min(63 + 8, 511) tokens
    assert mean_paged_tokens(10, 512, 0.125, 1e-9, page=1, draws=100) == 10 + 63 + RESERVE_AHEAD
