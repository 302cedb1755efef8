"""Invariant attention through a block table (the rollout's paged KV cache): the op and the
Triton kernel reading k, v as page pools [N, Hkv, PAGE, D] plus a block table [B, P] equal,
bitwise, the same op and kernel on the contiguous cache [B, Hkv, P * PAGE, D] those pages lay out
(the keys in the same BLOCK_N blocks from key 0, in the same order). Pages are scattered over the
pool in a shuffled order, the pool's other pages hold finite junk, and the cases are the rollout's:
a decode step (one query, boolean mask over the whole table), a ragged prefill chunk, and a
causal forward; pages of one key block and of two. The kernel addresses the pages itself (no
gathered copy: the contiguous cache is never built on its path).

Tier: bitwise. Kernels run compiled on CUDA, else in the Triton interpreter (conftest sets
TRITON_INTERPRET=1 without a GPU).
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.invariant.kv_pages import gather_pages
from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
OP = torch.ops.fp4_compile.invariant_attention.default
GATHER = torch.ops.fp4_compile.gather_kv_pages.default


def _paged(b, hkv, pages_per_row, page, d, seed):
    """(pool_k, pool_v, table, k, v): contiguous k, v [B, Hkv, P * PAGE, D] and the same keys
    in shuffled pages of a pool with spare junk pages, so gather_pages(pool, table) == k."""
    g = torch.Generator().manual_seed(seed)
    num_pages = b * pages_per_row + 3
    pool_k = torch.randn(num_pages, hkv, page, d, generator=g).bfloat16() * 50  # junk
    pool_v = torch.randn(num_pages, hkv, page, d, generator=g).bfloat16() * 50
    table = torch.randperm(num_pages, generator=g)[: b * pages_per_row].reshape(b, pages_per_row)
    k = torch.randn(b, hkv, pages_per_row * page, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, pages_per_row * page, d, generator=g).bfloat16()
    for i in range(b):
        for p in range(pages_per_row):
            pool_k[table[i, p]] = k[i, :, p * page : (p + 1) * page]
            pool_v[table[i, p]] = v[i, :, p * page : (p + 1) * page]
    assert torch.equal(gather_pages(pool_k, table), k)
    return [t.to(DEV) for t in (pool_k, pool_v, table, k, v)]


def _case(name, hq, hkv, page, d=16):
    """(q, pool_k, pool_v, table, k, v, q_start, kv_len, mask, causal) on DEV."""
    b, pages_per_row = 3, 3
    tk = pages_per_row * page
    pool_k, pool_v, table, k, v = _paged(b, hkv, pages_per_row, page, d, seed=hq + page)
    g = torch.Generator().manual_seed(7 * hq + page)
    if name == "decode":  # the rollout's decode step: its boolean mask over the whole table
        tq, lens = 1, torch.tensor([3, tk // 2 + 1, tk])
    elif name == "prefill":  # a chunk of 5 new tokens per row, ragged lengths
        tq, lens = 5, torch.tensor([5, tk // 2, tk - 1])
    else:  # "causal": a full forward, kv_len = every slot
        tq, lens = tk, None
    q = torch.randn(b, hq, tq, d, generator=g).bfloat16().to(DEV)
    if lens is None:
        qs, kl, mask, causal = torch.zeros(b, dtype=torch.long), torch.full((b,), tk), None, True
    else:
        pos = (lens - tq).clamp(min=0)[:, None] + torch.arange(tq)[None, :]
        j = torch.arange(tk)
        mask = ((j[None, None, :] <= pos[:, :, None]) & (j < lens[:, None, None]))[:, None]
        qs, kl, causal = torch.zeros(b, dtype=torch.long), torch.full((b,), tk), False
        mask = mask.to(DEV)
    return q, pool_k, pool_v, table, k, v, qs.to(DEV), kl.to(DEV), mask, causal


CASES = ["decode", "prefill", "causal"]


@pytest.mark.parametrize("page", [16, 32])
@pytest.mark.parametrize("name", CASES)
def test_op_through_block_table_equals_contiguous(name, page):
    """The op with a block table (CPU: the reference on the gathered pages; CUDA: the kernel)
    == the op on the contiguous cache, out and lse; the gather op is the contiguous layout."""
    q, pk, pv, table, k, v, qs, kl, mask, causal = _case(name, 4, 2, page)
    got = OP(q, pk, pv, qs, kl, mask, causal, 0.25, None, None, None, table)
    want = OP(q, k, v, qs, kl, mask, causal, 0.25)
    assert_bitwise_equal(got[0], want[0], f"{name} out, page {page}")
    assert_bitwise_equal(got[1], want[1], f"{name} lse, page {page}")
    assert_bitwise_equal(GATHER(pk, table), k, "gather_kv_pages")


def test_op_opcheck_and_no_backward_through_pages():
    q, pk, pv, table, *_, qs, kl, mask, causal = _case("decode", 4, 2, 16)
    torch.library.opcheck(OP, (q, pk, pv, qs, kl, mask, causal, 0.25, None, None, None, table))
    torch.library.opcheck(GATHER, (pk, table))
    out, _ = OP(q.requires_grad_(), pk, pv, qs, kl, mask, causal, 0.25, None, None, None, table)
    with pytest.raises(ValueError, match="paged cache .* has no backward"):
        out.sum().backward()  # the forward runs under grad mode; its backward is refused


needs_kernels = pytest.mark.skipif(
    not torch.cuda.is_available() and not interpreting(), reason="needs CUDA or the interpreter"
)


@needs_kernels
@pytest.mark.parametrize("page", [16, 32])
@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1)])
@pytest.mark.parametrize("name", CASES)
def test_kernel_through_block_table_equals_contiguous(name, hq, hkv, page):
    """The Triton kernel reading pages in place (block table, pool strides) == the kernel on
    the contiguous cache, bitwise: a page of one key block (16, the interpreter's BLOCK_N) and
    of two (32), grouped-query heads, junk in the pages no row names."""
    from fp4_compile.codegen.invariant import attention_kernel as ik

    q, pk, pv, table, k, v, qs, kl, mask, causal = _case(name, hq, hkv, page)
    got = ik.attention(q, pk, pv, qs, kl, mask, causal, 0.25, None, table)
    want = ik.attention(q, k, v, qs, kl, mask, causal, 0.25)
    assert_bitwise_equal(got[0], want[0], f"{name} out, Hq={hq} Hkv={hkv} page {page}")
    assert_bitwise_equal(got[1], want[1], f"{name} lse, Hq={hq} Hkv={hkv} page {page}")
    assert bool(torch.isfinite(got[0]).all())


@needs_kernels
def test_kernel_refuses_a_page_that_splits_a_key_block():
    from fp4_compile.codegen.invariant import attention_kernel as ik

    q, pk, pv, table, *_, qs, kl, mask, causal = _case("decode", 4, 2, 16)
    with pytest.raises(ValueError, match="multiple of the key block"):
        ik.attention(q, pk[:, :, :8], pv[:, :, :8], qs, kl, mask, causal, 0.25, None, table)
