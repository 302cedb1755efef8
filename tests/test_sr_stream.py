"""The stochastic-rounding stream (fp4_compile.sr_stream): pinned values, statistics, per-site
counters independent of call order, state save/restore; and the NVFP4 backward drawing fresh
noise on every call (one seed for every layer and step was a defect)."""

import pytest
import torch

import fp4_compile.codegen as cg
from fp4_compile import NVFP4Recipe
from fp4_compile.sr_stream import (
    call_seed,
    nth_call_seed,
    set_sr_state,
    site_id,
    site_seed,
    sr_state,
    sr_uniforms,
)
from fp4_compile.testing import assert_bitwise_equal


def test_uniforms_pinned_values():
    """The stream is part of the numerics contract: these bits must not change silently."""
    u = sr_uniforms((2, 3), 123, "cpu")
    want = torch.tensor([[10510628, 6311011, 8411043], [14719176, 4953663, 970457]]) / 2.0**24
    want = want.to(torch.float32)
    assert_bitwise_equal(u, want, "sr_uniforms(seed=123)")


def test_uniforms_statistics_and_range():
    u = sr_uniforms((1 << 20,), 7, "cpu")
    assert u.dtype == torch.float32 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 2e-3 and abs(float(u.std()) - 12**-0.5) < 2e-3
    # neighbouring indices and neighbouring seeds are uncorrelated
    v = sr_uniforms((1 << 20,), 8, "cpu")
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 5e-3
    assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 5e-3


def test_uniforms_bad_seed():
    with pytest.raises(ValueError, match="seed"):
        sr_uniforms((4,), -1, "cpu")


def test_call_seeds_per_site_independent_of_order():
    a, b = site_seed(0, site_id("layer0:linear:0")), site_seed(0, site_id("layer1:linear:0"))
    set_sr_state(None)
    first = [call_seed(a), call_seed(b), call_seed(a)]
    set_sr_state(None)
    second = [call_seed(b), call_seed(a), call_seed(a)]
    assert first[0] == second[1] and first[2] == second[2] and first[1] == second[0]
    assert len({*first}) == 3
    assert first[2] == nth_call_seed(a, 1)
    saved = sr_state()
    nxt = call_seed(a)
    set_sr_state(saved)
    assert call_seed(a) == nxt
    assert all(0 <= s < 2**63 - 4096 for s in first)
    set_sr_state(None)
    with pytest.raises(ValueError, match="non-negative"):
        set_sr_state({a: -1})


def test_backward_draws_fresh_noise_each_call_and_reproduces_after_reset():
    recipe = NVFP4Recipe.strict(seed=5)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 32, generator=g).requires_grad_()
    w = torch.randn(16, 32, generator=g).requires_grad_()
    dy = torch.randn(16, 16, generator=g)

    def grads():
        x.grad = w.grad = None
        cg.nvfp4_linear(x, w, recipe=recipe).backward(dy)
        return x.grad.clone(), w.grad.clone()

    set_sr_state(None)
    g1, g2 = grads(), grads()
    assert not torch.equal(g1[0], g2[0]) and not torch.equal(g1[1], g2[1])
    set_sr_state(None)
    again = grads()
    assert_bitwise_equal(again[0], g1[0], "dX after reset")
    assert_bitwise_equal(again[1], g1[1], "dW after reset")
    set_sr_state(None)


def test_sr_keys_on_device_equal_sr_key():
    from fp4_compile.sr_stream import sr_key, sr_keys

    for first in (0, 7, 2**40 + 4097, 2**62 + 3 * 4096):
        got = sr_keys(first, 130, "cpu").tolist()
        assert got == [sr_key(first + i) for i in range(130)], first
    with pytest.raises(ValueError, match="out of the non-negative"):
        sr_keys(-1, 2, "cpu")
