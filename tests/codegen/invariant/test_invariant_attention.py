"""Batch-invariant attention on CPU (the reference kernel).

Contracts, bitwise: decode against a static KV cache at position t == the full forward at t
(t across softmax-block boundaries, ragged batches with per-sequence lengths, stale garbage in
unused cache slots); prefill in chunks == prefill in one piece; a sequence alone == the same
sequence inside batches of 2, 3, 8, 33. Accuracy: within 2x the error of stock SDPA in bf16
against a float64 oracle; gradients against float64 autograd.
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.invariant import api as inv
from fp4_compile.codegen.invariant.reference import SOFTMAX_BLOCK
from fp4_compile.testing import assert_bitwise_equal

HQ, HKV, D = 4, 2, 32


def _qkv(b, t, *, seed=0, hq=HQ, hkv=HKV, d=D):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, t, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, t, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, t, d, generator=g).bfloat16()
    return q, k, v


def _oracle(q, k, v, vis):
    g = q.shape[1] // k.shape[1]
    kd, vd = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = (q.double() @ kd.transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~vis, float("-inf"))
    return torch.softmax(s, -1) @ vd


def test_accuracy_vs_fp64_budget():
    """|inv - fp64| <= 2 x |SDPA(bf16) - fp64| (same bf16 inputs, bf16 output)."""
    q, k, v = _qkv(2, 100)
    out = inv.attention(q, k, v)
    vis = torch.ones(100, 100, dtype=torch.bool).tril()
    oracle = _oracle(q, k, v, vis)
    stock = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    budget = 2 * (stock.double() - oracle).abs().max()
    assert (out.double() - oracle).abs().max() <= budget


@pytest.mark.parametrize(
    "t", [0, 1, SOFTMAX_BLOCK - 1, SOFTMAX_BLOCK, SOFTMAX_BLOCK + 1, 2 * SOFTMAX_BLOCK + 5, 99]
)
def test_decode_equals_full_forward(t):
    """Bitwise: decode (Tq = 1, cache [B, Hkv, S_max, D] with garbage past t) == full forward."""
    q, k, v = _qkv(3, 100)
    full = inv.attention(q, k, v)
    s_max = 160
    k_cache = torch.full((3, HKV, s_max, D), float("nan")).bfloat16()
    v_cache = torch.full((3, HKV, s_max, D), float("inf")).bfloat16()
    k_cache[:, :, : t + 1], v_cache[:, :, : t + 1] = k[:, :, : t + 1], v[:, :, : t + 1]
    k_cache[:, :, t + 1 :] = 7.0  # finite stale keys and non-finite stale values
    dec = inv.attention(q[:, :, t : t + 1], k_cache, v_cache, q_start=t, kv_len=t + 1)
    assert_bitwise_equal(dec, full[:, :, t : t + 1], f"decode at t={t}")


def test_ragged_decode_and_padding():
    """Right-padded ragged batch: per-sequence kv_len, decode positions differ per sequence;
    each row equals the sequence's own full forward; padding never changes real rows."""
    lengths = [5, 33, 64, 17]
    seqs = [_qkv(1, n, seed=i) for i, n in enumerate(lengths)]
    s_max = 64
    q_pad = torch.zeros(4, HQ, s_max, D).bfloat16()
    k_pad = torch.randn(4, HKV, s_max, D).bfloat16() * 100  # padding holds junk
    v_pad = torch.randn(4, HKV, s_max, D).bfloat16() * 100
    for i, (q, k, v) in enumerate(seqs):
        n = lengths[i]
        q_pad[i, :, :n], k_pad[i, :, :n], v_pad[i, :, :n] = q[0], k[0], v[0]
    lens = torch.tensor(lengths)
    learner = inv.attention(q_pad, k_pad, v_pad, kv_len=lens)  # learner forward, right-padded
    for i, (q, k, v) in enumerate(seqs):
        alone = inv.attention(q, k, v)
        assert_bitwise_equal(learner[i : i + 1, :, : lengths[i]], alone, f"padded seq {i}")
    last = lens - 1
    q_last = torch.stack([q_pad[i, :, int(last[i])] for i in range(4)])[:, :, None]
    dec = inv.attention(q_last, k_pad, v_pad, q_start=last, kv_len=lens)
    for i in range(4):
        assert_bitwise_equal(dec[i, :, 0], learner[i, :, int(last[i])], f"ragged decode seq {i}")


@pytest.mark.parametrize("chunks", [(1, 99), (32, 32, 36), (7, 50, 43), (64, 36)])
def test_chunked_prefill_equals_one_piece(chunks):
    q, k, v = _qkv(2, 100, seed=3)
    whole = inv.attention(q, k, v)
    start = 0
    for n in chunks:
        part = inv.attention(q[:, :, start : start + n], k, v, q_start=start, kv_len=start + n)
        assert_bitwise_equal(part, whole[:, :, start : start + n], f"chunk at {start}")
        start += n


def test_batch_invariance():
    """A sequence alone == the same sequence in batches of 2, 3, 8, 33 at first/middle/last."""
    q, k, v = _qkv(1, 40, seed=5)
    alone = inv.attention(q, k, v)
    for n in (2, 3, 8, 33):
        qb, kb, vb = _qkv(n, 40, seed=n)
        for pos in sorted({0, n // 2, n - 1}):
            qb2, kb2, vb2 = qb.clone(), kb.clone(), vb.clone()
            qb2[pos], kb2[pos], vb2[pos] = q[0], k[0], v[0]
            out = inv.attention(qb2, kb2, vb2)
            assert_bitwise_equal(out[pos : pos + 1], alone, f"batch {n} @ {pos}")


def test_mask_equals_kv_len():
    """A boolean padding mask and kv_len describe the same visibility: identical bits."""
    q, k, v = _qkv(2, 48)
    lens = torch.tensor([30, 48])
    mask = (torch.arange(48)[None, :] < lens[:, None])[:, None, None, :].expand(2, 1, 48, 48)
    assert_bitwise_equal(
        inv.attention(q, k, v, mask=mask), inv.attention(q, k, v, kv_len=lens), "mask"
    )


def test_backward_vs_fp64():
    """dq, dk, dv (GQA, causal, ragged kv_len) vs float64 autograd: within 2x the error of stock
    SDPA's bf16 backward on the same inputs (the independent implementation's budget)."""
    q, k, v = _qkv(2, 45, seed=7)
    lens = torch.tensor([45, 30])
    j = torch.arange(45)
    vis = (j[None, None, :] <= j[None, :, None]) & (j[None, None, :] < lens[:, None, None])
    vis = vis[:, None]
    go = torch.randn(2, HQ, 45, D, generator=torch.Generator().manual_seed(1)).bfloat16()

    def grads(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward(go.to(dtype))
        return [t.grad.double() for t in leaves]

    ours = grads(lambda a, b, c: inv.attention(a, b, c, kv_len=lens), torch.bfloat16)
    oracle = grads(lambda a, b, c: _oracle(a, b, c, vis), torch.float64)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    stock = grads(lambda a, b, c: sdpa(a, b, c, attn_mask=vis, enable_gqa=True), torch.bfloat16)
    for name, got, ref, base in zip("qkv", ours, oracle, stock):
        err, budget = (got - ref).abs().max(), 2 * (base - ref).abs().max()
        assert err <= budget, f"d{name}: error {err:.3g} over budget {budget:.3g}"


def test_opcheck_and_errors():
    q, k, v = _qkv(2, 20)
    args = (q.requires_grad_(), k, v, torch.tensor([0, 0]), torch.tensor([20, 12]), None, True, 0.2)
    torch.library.opcheck(torch.ops.fp4_compile.invariant_attention, args)
    with pytest.raises(ValueError, match="q_start is required"):
        inv.attention(q[:, :, :1], k, v)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        inv.attention(q[:, :3], k, v)
    with pytest.raises(TypeError, match="q must have dtype"):
        inv.attention(q.float(), k, v)
    with pytest.raises(ValueError, match="kv_len must have shape"):
        inv.attention(q, k, v, kv_len=torch.tensor([3]))
    with pytest.raises(TypeError, match="mask must be"):
        inv.attention(q, k, v, mask=torch.ones(2, 1, 20, 20))
