"""The rollout engine quantizes each weight once per weight version (codegen/nvfp4/weight_cache.py):
cached rollouts are bitwise the uncached ones, and update_weights drops the cache, also when the
engine shares the learner's module and a fused optimizer changed it without a version bump; a
shared-scale group is requantized as a whole when one member changes."""

import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.nvfp4.weight_cache import WeightCache, active_cache
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine
from fp4_compile.testing import assert_bitwise_equal

PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1]]


def _generate(engine):
    return engine.generate(PROMPTS, max_new_tokens=6, seed=3)


def _assert_same(a, b, what):
    assert a.tokens == b.tokens, what
    for i, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
        assert_bitwise_equal(x, y, f"{what}: request {i}")


def test_cache_hits_are_bitwise_the_uncached_result():
    torch.manual_seed(0)
    model = tiny_qwen3_moe(layers=2).eval()
    recipe = NVFP4Recipe.strict()
    engine = RolloutEngine(model, recipe=recipe, max_batch=4, max_seq_len=32)
    first = _generate(engine)
    misses = engine.weight_cache.misses
    assert misses > 0 and engine.weight_cache.hits > 0, "decode steps must hit the cache"
    again = _generate(engine)
    assert engine.weight_cache.misses == misses, "no weight re-quantized while unchanged"
    engine.weight_cache.clear()
    with WeightCache() as other:  # an inner, empty cache: every weight quantized afresh
        assert active_cache() is other
    assert active_cache() is None
    _assert_same(first, again, "cached vs first")


def test_update_weights_drops_the_cache_for_a_shared_module():
    torch.manual_seed(0)
    model = tiny_qwen3_moe(layers=2)
    recipe = NVFP4Recipe.strict()
    engine = RolloutEngine(model, recipe=recipe, max_batch=4, max_seq_len=32)
    before = _generate(engine)
    params = [p for p in model.parameters() if p.dim() >= 2]
    for p in params:
        p.grad = torch.randn_like(p)
    versions = [p._version for p in params]
    torch.optim.AdamW(params, lr=0.05, fused=True).step()  # in place, no version bump
    assert [p._version for p in params] == versions, "premise: the fused step bumps nothing"
    stale = _generate(engine)  # the BF16 modules see the new weights, the NVFP4 ones do not
    want = _generate(RolloutEngine(model, recipe=recipe, max_batch=4, max_seq_len=32))
    differs = stale.tokens != want.tokens or any(
        not torch.equal(a, b) for a, b in zip(stale.logprobs, want.logprobs)
    )
    assert differs, "without update_weights the cache serves the old NVFP4 bytes (the premise)"
    engine.update_weights(model)
    _assert_same(_generate(engine), want, "after update_weights == a fresh engine")
    assert want.tokens != before.tokens, "the update must change the rollout (else no test)"


def test_hits_only_refuses_a_miss_and_allows_hits():
    cache = WeightCache()
    w = torch.ones(16, 16)
    calls = []

    def compute():
        calls.append(1)
        return (w * 2,)

    with cache.hits_only():
        try:
            cache.get(w, "per_tensor", compute)
        except RuntimeError as e:
            assert "miss" in str(e)
        else:
            raise AssertionError("a miss inside hits_only() must raise")
    assert not calls
    (first,) = cache.get(w, "per_tensor", compute)
    with cache.hits_only():
        (again,) = cache.get(w, "per_tensor", compute)
    assert torch.equal(first, again) and len(calls) == 1


def test_a_changed_group_member_requantizes_the_whole_group():
    """Shared-scale groups (q/k/v): while unchanged, the group amax and every member's bytes are
    cache hits; an in-place change of ONE member (a version bump) that moves the group amax
    makes the other members' bytes follow, bitwise the uncached result."""
    ops = torch.ops.fp4_compile
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(n, 32, generator=g).to(torch.bfloat16) for n in (64, 32, 32)]

    def quantized():
        amax = ops.weight_group_amax(ws)
        return [ops.quantize(w, "16x16", "shared", amax, "rne", 0) for w in ws]

    cache = WeightCache()
    with cache:
        first = quantized()
        misses = cache.misses
        again = quantized()
        assert cache.misses == misses and cache.hits == 4, (cache.hits, cache.misses)
        ws[1].mul_(4.0)  # k alone changes; the group's amax is now k's
        changed = quantized()
    fresh = quantized()  # no cache
    for i, (a, b) in enumerate(zip(changed, fresh)):
        for part, x, y in zip(("codes", "scales", "gd"), a, b):
            assert_bitwise_equal(x, y, f"member {i} {part} after the change")
    for part, x, y in zip(("codes", "scales", "gd"), first[0], again[0]):
        assert_bitwise_equal(x, y, f"q {part} cached")
    assert not torch.equal(changed[0][2], first[0][2]), "q's global scale must follow k's amax"


def test_cuda_graphs_need_a_cuda_device():
    import pytest

    model = tiny_qwen3_moe(layers=1).eval()
    with pytest.raises(ValueError, match="cuda_graphs"):
        RolloutEngine(model, recipe=NVFP4Recipe.strict(), device="cpu", cuda_graphs=True)
    with pytest.raises(TypeError, match="cuda_graphs"):
        RolloutEngine(model, recipe=NVFP4Recipe.strict(), device="cpu", cuda_graphs="yes")


def test_hits_are_the_cached_tensors_and_stale_entries_are_never_served():
    """A hit hands out the cached tensors themselves (no per-call copy); an in-place write that
    bumps the version, or the same address under another (new) tensor, is a miss."""
    cache = WeightCache()
    base = torch.ones(256)
    calls = []

    def compute(t):
        def run():
            calls.append(1)
            return (t * 2,)

        return run

    w = base.view(16, 16)
    (first,) = cache.get(w, "per_tensor", compute(w))
    (again,) = cache.get(w, "per_tensor", compute(w))
    assert again is first and len(calls) == 1, "a hit is the cached tensor, not a copy"
    base.add_(1)  # bumps the version counter shared by the view
    (bumped,) = cache.get(w, "per_tensor", compute(w))
    assert len(calls) == 2 and float(bumped[0, 0]) == 4.0, "a bumped version recomputes"
    del w
    other = base.view(16, 16)  # same address, shape, strides and version: another tensor
    cache.get(other, "per_tensor", compute(other))
    assert len(calls) == 3, "an entry whose weight died is never served to a new tensor"


def test_rollout_graphs_compile_without_buffer_reuse(monkeypatch):
    """The engine compiles its step with options['rollout']: Inductor gets no buffer reuse and
    no in-place buffers, which is what lets the cache hand out its tensors uncopied (the AOTI
    configs of an exported rollout likewise)."""
    import torch._inductor.compile_fx as cfx

    from fp4_compile.backend import ROLLOUT_INDUCTOR_CONFIG, aoti_inductor_configs

    assert ROLLOUT_INDUCTOR_CONFIG == {"allow_buffer_reuse": False, "inplace_buffers": False}
    assert all(aoti_inductor_configs()[k] == v for k, v in ROLLOUT_INDUCTOR_CONFIG.items())
    seen = []
    real = cfx.compile_fx

    def spy(gm, inputs, config_patches=None, **kw):
        seen.append(dict(config_patches or {}))
        return real(gm, inputs, config_patches=config_patches, **kw)

    monkeypatch.setattr(cfx, "compile_fx", spy)
    torch._dynamo.reset()
    model = tiny_qwen3_moe(layers=1).eval()
    engine = RolloutEngine(model, recipe=NVFP4Recipe.strict(), max_batch=2, max_seq_len=16)
    engine.generate([[3, 5]], max_new_tokens=2, seed=0)
    outer = [p for p in seen if p]  # compile_fx re-enters itself with the patches applied
    assert outer, "the engine's step went through the minite backend"
    for patches in outer:
        assert all(patches.get(k) == v for k, v in ROLLOUT_INDUCTOR_CONFIG.items()), patches
