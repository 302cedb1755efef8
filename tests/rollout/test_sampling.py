"""The device-side Gumbel sampler: a pure function of (request seed, draw index, token id)."""

from __future__ import annotations

import math

import pytest
import torch

from fp4_compile.rollout.sampling import gumbel_noise, request_keys, sample


def test_noise_row_depends_only_on_its_own_seed_and_step():
    keys = request_keys([7, 8, 9], "cpu")
    both = gumbel_noise(keys, 3, 50)
    alone = gumbel_noise(request_keys([8], "cpu"), 3, 50)
    assert torch.equal(both[1], alone[0])
    assert not torch.equal(both[0], both[1])
    assert not torch.equal(gumbel_noise(keys, 4, 50), both)
    assert torch.equal(gumbel_noise(keys, 3, 50), both)


def test_noise_is_standard_gumbel():
    noise = gumbel_noise(request_keys(list(range(16)), "cpu"), 0, 20000).double()
    assert torch.isfinite(noise).all()
    euler_gamma, var = 0.5772156649, math.pi**2 / 6
    assert abs(noise.mean().item() - euler_gamma) < 0.01
    assert abs(noise.var().item() - var) < 0.03


def test_sampled_token_frequencies_follow_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).expand(4000, 4)
    picked = sample(logits, gumbel_noise(request_keys(list(range(4000)), "cpu"), 0, 4))
    freq = torch.bincount(picked, minlength=4).double() / 4000
    assert torch.allclose(freq, torch.softmax(logits[0].double(), 0), atol=0.025)


def test_bad_seeds_are_named():
    with pytest.raises(ValueError, match=r"seed\[1\]"):
        request_keys([0, -1], "cpu")
    with pytest.raises(TypeError, match=r"seed\[0\]"):
        request_keys([1.5], "cpu")


def test_eos_ends_each_request_at_its_first_eos():
    from fp4_compile import NVFP4Recipe
    from fp4_compile.models import tiny_qwen3
    from fp4_compile.rl import RolloutEngine

    torch.manual_seed(0)
    model = tiny_qwen3(layers=1).eval()
    engine = RolloutEngine(model, recipe=NVFP4Recipe.bf16(), max_batch=4, max_seq_len=64)
    prompts = [[3, 5, 7], [11, 2], [4, 4, 9]]
    free = engine.generate(prompts, max_new_tokens=20, seed=5)
    eos = free.tokens[0][2]  # a token request 0 draws at its third step
    out = engine.generate(prompts, max_new_tokens=20, seed=5, eos_token_id=eos)
    for i, row in enumerate(free.tokens):
        n = row.index(eos) + 1 if eos in row else len(row)
        assert out.tokens[i] == row[:n], i
        assert out.finish_reasons[i] == ("eos" if eos in row else "length"), i
        assert torch.equal(out.logprobs[i], free.logprobs[i][:n]), i
    assert out.finish_reasons[0] == "eos" and len(out.tokens[0]) <= 3


def test_device_step_counter_draws_the_host_steps_noise():
    """gumbel_noise with the step as an int64 [] tensor (a decode program's device counter) ==
    with the step as a Python int, bitwise, small and large steps."""
    keys = request_keys([0, 5, 123456789, 2**40], "cpu")
    for step in (0, 1, 7, 31, 1000, 2**31 + 5, 2**33 + 1):
        host = gumbel_noise(keys, step, 300)
        device = gumbel_noise(keys, torch.tensor(step), 300)
        assert torch.equal(host.view(torch.int32), device.view(torch.int32)), step
    with pytest.raises(TypeError, match="tensor step"):
        gumbel_noise(keys, torch.tensor(1.0), 300)


def test_per_row_step_counters_draw_each_rows_own_noise():
    """gumbel_noise with one step per row (int64 [B]: a continuously batched decode program)
    gives row r the noise of its own step as a host int, bitwise; a step vector of the wrong
    length or dtype is refused."""
    keys = request_keys([0, 5, 123456789, 2**40], "cpu")
    steps = [3, 0, 2**31 + 5, 17]
    got = gumbel_noise(keys, torch.tensor(steps), 300)
    for r, step in enumerate(steps):
        want = gumbel_noise(keys[r : r + 1], step, 300)
        assert torch.equal(got[r : r + 1].view(torch.int32), want.view(torch.int32)), r
    with pytest.raises(TypeError, match="tensor step"):
        gumbel_noise(keys, torch.tensor([1, 2, 3]), 300)
    with pytest.raises(TypeError, match="tensor step"):
        gumbel_noise(keys, torch.tensor([1.0, 2.0, 3.0, 4.0]), 300)
