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
    """The stream is part of the numerics contract: these bits must not change silently.
    (Changed on 2026-12-04: one mixer round below index 2^32, the kernel's ALU cost.)"""
    u = sr_uniforms((2, 3), 123, "cpu")
    want = torch.tensor([[9868074, 13253248, 2969796], [1557271, 8623703, 981616]]) / 2.0**24
    want = want.to(torch.float32)
    assert_bitwise_equal(u, want, "sr_uniforms(seed=123)")


def test_uniforms_one_round_below_2_32_two_above():
    """u = mix(lo ^ key) >> 8 below index 2^32; from there a second round mixes the high word
    in (else index i and i + 2^32 would draw the same noise)."""
    from fp4_compile.sr_stream import M32, mix32_int, sr_key, uniforms_at

    key = sr_key(123)
    idx = torch.tensor([5, 2**32 - 1, 2**32 + 5, 3 * 2**32 + 5])
    u = uniforms_at(idx, key)
    one = [(mix32_int((i & M32) ^ key) >> 8) / 2.0**24 for i in idx.tolist()]
    two = [
        (mix32_int(mix32_int((i & M32) ^ key) ^ (i >> 32) ^ (key >> 1)) >> 8) / 2.0**24
        for i in idx.tolist()
    ]
    assert u.tolist() == one[:2] + two[2:]
    assert len(set(u.tolist())) == 4 and u[0] != u[2]


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


@pytest.fixture
def fresh_device_counters(monkeypatch):
    """The device counters are process state: each test gets its own (and leaves none)."""
    from fp4_compile import sr_stream

    monkeypatch.setattr(sr_stream, "_device_counters", {})
    set_sr_state(None)
    yield sr_stream
    set_sr_state(None)


def test_device_counters_give_the_graph_family_seeds(fresh_device_counters):
    """Bitwise: the n-th device-drawn seed of a site == nth_call_seed of its graph family (not
    the host family: graph and host calls never share a seed); the counters advance on the
    device, are saved in sr_state() and restored by set_sr_state(); an unprepared site is a
    clear error."""
    sr = fresh_device_counters
    a = site_seed(3, site_id("layers.0.mlp.experts:grouped:0"))
    g = sr.graph_site_key(a)
    assert g != a
    with pytest.raises(RuntimeError, match="no device stochastic-rounding counter"):
        sr.device_call_seed(a, "cpu")
    sr.prepare_device_counters([a], "cpu")
    seeds = [sr.device_call_seed(a, "cpu") for _ in range(3)]
    assert all(s.dtype == torch.int64 and s.shape == (1,) for s in seeds)
    assert [int(s) for s in seeds] == [nth_call_seed(g, n) for n in range(3)]
    assert nth_call_seed(g, 0) not in {nth_call_seed(a, n) for n in range(3)}
    assert call_seed(a) == nth_call_seed(a, 0)  # the host family is untouched
    saved = sr_state()
    assert saved[g] == 3 and saved[a] == 1
    nxt = int(sr.device_call_seed(a, "cpu"))
    set_sr_state(saved)
    assert int(sr.device_call_seed(a, "cpu")) == nxt == nth_call_seed(g, 3)
    set_sr_state(None)
    assert int(sr.device_call_seed(a, "cpu")) == nth_call_seed(g, 0)
    # a counter made after a state restore starts at the restored count
    b = site_seed(3, site_id("layers.1.mlp.experts:grouped:0"))
    set_sr_state({sr.graph_site_key(b): 5})
    sr.prepare_device_counters([b], "cpu")
    assert int(sr.device_call_seed(b, "cpu")) == nth_call_seed(sr.graph_site_key(b), 5)


def test_backward_seed_switches_to_the_device_counter_while_capturing(
    fresh_device_counters, monkeypatch
):
    """The NVFP4 backward ops draw host-counted seeds, except while a CUDA graph is being
    captured: then the site's device counter (so every replay advances it)."""
    from fp4_compile.codegen.nvfp4 import linear as linear_module

    sr = fresh_device_counters
    a = site_seed(0, site_id("layers.0.self_attn.q_proj:linear:0"))
    cpu = torch.device("cpu")
    assert linear_module.capturing(cpu) is False
    assert linear_module.backward_seed(a, cpu) == nth_call_seed(a, 0)
    sr.prepare_device_counters([a], cpu)
    monkeypatch.setattr(linear_module, "capturing", lambda device: True)
    s = linear_module.backward_seed(a, cpu)
    assert isinstance(s, sr.DeviceSeed) and s.offset == 0
    assert int(s.tensor) == nth_call_seed(sr.graph_site_key(a), 0)
    assert int(linear_module.backward_seed(a, cpu).tensor) == nth_call_seed(sr.graph_site_key(a), 1)
