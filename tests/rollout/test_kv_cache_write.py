"""The KV-cache write does no work proportional to the cache (fp4_compile/rollout/kv_cache.py):
read from Inductor's generated code of the engine's steps (prefill and the Tq = 1 decode step) on
the CPU, every layer's K and V caches (graph inputs) are written in place by one
`fp4_compile::kv_cache_write`, and no buffer of a whole layer cache is allocated (the clone a
functionalized write would make, written and copied back every step). Plus: the write stores
exactly the new rows, bitwise."""

import re

import pytest
import torch
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rollout import RolloutEngine
from fp4_compile.rollout.kv_cache import StaticKVCache
from fp4_compile.testing import assert_bitwise_equal

MAX_SEQ_LEN = 48  # a cache shape no other tensor of the tiny model has


def _cache_args(code: str, cache_shape: tuple[int, ...]) -> list[str]:
    """Names of the generated module's inputs of the cache's shape (from its `get_args`)."""
    shape = re.escape(str(cache_shape))
    return re.findall(rf"(arg\d+_1) = rand_strided\({shape},", code)


def _call_body(code: str) -> str:
    start = code.index("    def call(self, args):")
    return code[start : code.index("\ndef get_args", start)]


@pytest.fixture(scope="module")
def step_codes():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = tiny_qwen3(layers=2).eval()
    engine = RolloutEngine(model, recipe=NVFP4Recipe.strict(), max_batch=2, max_seq_len=MAX_SEQ_LEN)
    cache_shape = (2, engine.num_kv_heads, MAX_SEQ_LEN, engine.head_dim)
    with inductor_config.patch({"force_disable_caches": True}):
        _, codes = run_and_get_code(
            lambda: engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=3, seed=0)
        )
    return codes, cache_shape, 2 * engine.num_layers


def test_cache_written_in_place_no_whole_cache_copy(step_codes):
    """Contract: per step, the generated code allocates no buffer of a layer cache's shape (no
    clone, no copy back) and writes every cache input in place, a layer's K and V by one
    `kv_cache_write`; checked on the prefill and on the decode step (positions [B, 1])."""
    codes, cache_shape, num_caches = step_codes
    steps = [c for c in codes if _cache_args(c, cache_shape)]
    decode = [c for c in steps if re.search(r"rand_strided\(\(2, 1\), \(1, 1\), .*int64", c)]
    assert len(steps) == 2 and len(decode) == 1, "a prefill and a decode step were compiled"
    shape = re.escape(str(cache_shape))
    for code in steps:
        body, caches = _call_body(code), _cache_args(code, cache_shape)
        assert len(caches) == num_caches
        copies = re.findall(rf"(buf\d+) = empty_strided_\w+\({shape},", body)
        assert not copies, f"whole-cache buffers {copies}: the cache is cloned and copied back"
        written = re.findall(r"kv_cache_write\.default\((arg\d+_1), (arg\d+_1),", body)
        assert len(written) == num_caches // 2, "one write of both caches per layer"
        flat = {name for pair in written for name in pair}
        assert flat == set(caches), f"caches {caches} written in place: {sorted(flat)}"


def test_paged_pools_written_in_place_no_whole_pool_copy():
    """The same contract for kv_cache="paged": every layer's K and V page pools (graph inputs)
    are written in place through the block table by one `kv_cache_write` per layer, and no
    buffer of a pool's shape is allocated."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = tiny_qwen3(layers=2).eval()
    engine = RolloutEngine(
        model,
        recipe=NVFP4Recipe.strict(),
        max_batch=2,
        max_seq_len=MAX_SEQ_LEN,
        kv_cache="paged",
        kv_tokens=192,
    )
    pool_shape = (
        engine.paged.num_pages,
        engine.num_kv_heads,
        engine.paged.page_size,
        engine.head_dim,
    )
    with inductor_config.patch({"force_disable_caches": True}):
        _, codes = run_and_get_code(
            lambda: engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=3, seed=0)
        )
    steps = [c for c in codes if _cache_args(c, pool_shape)]
    assert len(steps) == 2, "a prefill and a decode step were compiled"
    shape = re.escape(str(pool_shape))
    for code in steps:
        body, pools = _call_body(code), _cache_args(code, pool_shape)
        assert len(pools) == 2 * engine.num_layers
        copies = re.findall(rf"(buf\d+) = empty_strided_\w+\({shape},", body)
        assert not copies, f"whole-pool buffers {copies}: the pool is cloned and copied back"
        written = re.findall(r"kv_cache_write\.default\((arg\d+_1), (arg\d+_1),", body)
        assert len(written) == engine.num_layers, "one write of both pools per layer"
        assert {n for pair in written for n in pair} == set(pools)


def test_update_writes_exactly_the_new_rows():
    """Contract (bitwise): `update` stores key/value [B, H_kv, Tq, D] at cache[b, h, pos[b, t]]
    and leaves every other slot's bytes as they were; it returns the cache tensors themselves."""
    g = torch.Generator().manual_seed(3)
    b, h, s, d, t = 3, 2, 10, 8, 4
    cache = StaticKVCache(
        num_layers=1,
        batch=b,
        num_kv_heads=h,
        head_dim=d,
        max_seq_len=s,
        dtype=torch.bfloat16,
        device="cpu",
    )
    for tensor in (cache.keys[0], cache.values[0]):
        tensor.copy_(torch.randn(tensor.shape, generator=g))
    before_k, before_v = cache.keys[0].clone(), cache.values[0].clone()
    pos = torch.stack([torch.randperm(s, generator=g)[:t] for _ in range(b)])
    k_new = torch.randn(b, h, t, d, generator=g).bfloat16()
    v_new = torch.randn(b, h, t, d, generator=g).bfloat16()
    cache.set_write_positions(pos)
    k_out, v_out = cache.update(k_new, v_new, 0)
    assert k_out is cache.keys[0] and v_out is cache.values[0]
    for out, before, new in ((k_out, before_k, k_new), (v_out, before_v, v_new)):
        want = before.clone()
        for i in range(b):
            for j in range(t):
                want[i, :, pos[i, j]] = new[i, :, j]
        assert_bitwise_equal(out, want, "cache after the write")
