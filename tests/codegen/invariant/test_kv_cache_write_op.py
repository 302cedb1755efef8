"""fp4_compile::kv_cache_write (a layer's new keys and values stored into its static KV cache, or
through a block table into its paged pools, in one launch).

Tiers: bitwise (the op == the two `index_put_` it replaces: every byte of both caches after the
write, the untouched slots included; the Triton kernel in the interpreter == the reference, with
v a transposed view as the model hands it, Tq = 1 and Tq > 1; paged: the same, each position
landing on its page's slot, idle rows on the scratch page); integration (opcheck); bad input
names the argument.
"""

import pytest
import torch

from fp4_compile.codegen.invariant import decode_reference
from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
B, H, S, D = 3, 2, 10, 24


def _case(tq, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    caches = [torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(2)]
    positions = torch.stack([torch.randperm(S, generator=g)[:tq] for _ in range(B)])
    k = torch.randn(B, H, tq, D, generator=g).to(dtype)
    v = torch.randn(B, tq, H, D, generator=g).to(dtype).transpose(1, 2)  # the model's view
    return caches, positions, k, v


def _expected(caches, positions, k, v):
    want = [c.clone() for c in caches]
    for b in range(B):
        for t in range(positions.shape[1]):
            want[0][b, :, positions[b, t]] = k[b, :, t]
            want[1][b, :, positions[b, t]] = v[b, :, t]
    return want


@pytest.mark.parametrize("tq", [1, 4])
def test_op_writes_exactly_the_new_rows(tq):
    caches, positions, k, v = _case(tq)
    want = _expected(caches, positions, k, v)
    ops.kv_cache_write(*caches, positions, k, v)
    for got, w, what in zip(caches, want, ("k_cache", "v_cache")):
        assert_bitwise_equal(got, w, what)


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("tq", [1, 4])
def test_kernel_equals_reference_interpreter(tq, expanded):
    """Bitwise (interpreter; FP32 so no cast is involved): kernel == reference; positions as
    given, or a prefill's broadcast arange (stride 0 over sequences)."""
    from fp4_compile.codegen.invariant.kv_cache_write_kernel import kv_cache_write

    caches, positions, k, v = _case(tq, torch.float32, seed=1)
    if expanded:
        positions = torch.arange(3, 3 + tq).expand(B, tq)
    want = [c.clone() for c in caches]
    decode_reference.kv_cache_write(*want, positions, k, v)
    kv_cache_write(*caches, positions, k, v)
    for got, w, what in zip(caches, want, ("k_cache", "v_cache")):
        assert_bitwise_equal(got, w, what)


def test_opcheck():
    """torch.library.opcheck: schema (both caches written), fake tensors, aot dispatch."""
    caches, positions, k, v = _case(2)
    torch.library.opcheck(ops.kv_cache_write.default, (*caches, positions, k, v))


def test_bad_input_names_the_argument():
    caches, positions, k, v = _case(2)
    with pytest.raises(ValueError, match="positions"):
        ops.kv_cache_write(*caches, positions.int(), k, v)
    with pytest.raises(ValueError, match="^v must"):
        ops.kv_cache_write(*caches, positions, k, v[:, :1])
    with pytest.raises(ValueError, match="v_cache"):
        ops.kv_cache_write(caches[0], caches[1][:1], positions, k, v)

    with pytest.raises(ValueError, match="block_table"):
        ops.kv_cache_write(*caches, positions, k, v, positions.int())


N, PAGE = 7, 4  # page pools [N, H, PAGE, D]; block tables [B, S // PAGE + 1]


def _paged_case(tq, dtype=torch.bfloat16, seed=0):
    """Pools, a block table of distinct shuffled pages per sequence (page 0 the scratch page,
    also where the unused table entries point), positions within each sequence's pages."""
    g = torch.Generator().manual_seed(seed)
    pools = [torch.randn(N, H, PAGE, D, generator=g).to(dtype) for _ in range(2)]
    pages = 1 + torch.randperm(N - 1, generator=g)[: 2 * B].view(B, 2)
    table = torch.cat([pages, torch.zeros(B, 1, dtype=torch.int64)], dim=1)
    positions = torch.stack([torch.randperm(2 * PAGE, generator=g)[:tq] for _ in range(B)])
    k = torch.randn(B, H, tq, D, generator=g).to(dtype)
    v = torch.randn(B, tq, H, D, generator=g).to(dtype).transpose(1, 2)
    return pools, positions, k, v, table


def _paged_expected(pools, positions, k, v, table):
    want = [c.clone() for c in pools]
    for b in range(B):
        for t in range(positions.shape[1]):
            p = int(positions[b, t])
            page, slot = int(table[b, p // PAGE]), p % PAGE
            want[0][page, :, slot] = k[b, :, t]
            want[1][page, :, slot] = v[b, :, t]
    return want


@pytest.mark.parametrize("tq", [1, 3])
def test_paged_op_writes_each_position_to_its_page(tq):
    pools, positions, k, v, table = _paged_case(tq)
    want = _paged_expected(pools, positions, k, v, table)
    ops.kv_cache_write(*pools, positions, k, v, table)
    for got, w, what in zip(pools, want, ("k pool", "v pool")):
        assert_bitwise_equal(got, w, what)


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
@pytest.mark.parametrize("tq", [1, 3])
def test_paged_kernel_equals_reference_interpreter(tq):
    from fp4_compile.codegen.invariant.kv_cache_write_kernel import kv_cache_write

    pools, positions, k, v, table = _paged_case(tq, torch.float32, seed=2)
    want = [c.clone() for c in pools]
    decode_reference.kv_cache_write(*want, positions, k, v, table)
    kv_cache_write(*pools, positions, k, v, table)
    for got, w, what in zip(pools, want, ("k pool", "v pool")):
        assert_bitwise_equal(got, w, what)


def test_paged_opcheck():
    pools, positions, k, v, table = _paged_case(2)
    torch.library.opcheck(ops.kv_cache_write.default, (*pools, positions, k, v, table))
