"""The Triton kernels of the invariant ops, run in the Triton interpreter on CPU (conftest sets
TRITON_INTERPRET=1 when there is no GPU).

Contracts: bitwise batch invariance of each kernel (rows alone == rows inside batches of 2, 3, 8,
33); attention decode == full forward, chunked prefill == one piece, ragged batches, bitwise;
kernel vs the CPU reference op within an FP32-accumulation budget (the interpreter's fp32
`tl.dot` uses numpy, so bits are not expected to match the reference).
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.invariant import reference as cpu
from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter tests (CPU only)"
)


@pytest.fixture(scope="module")
def ik():
    pytest.importorskip("triton")
    from types import SimpleNamespace

    from fp4_compile.codegen.invariant import (
        attention_kernel,
        linear_kernel,
        logprobs_kernel,
        rms_norm_kernel,
        routing_kernel,
    )

    return SimpleNamespace(
        linear=linear_kernel.linear,
        rms_norm=rms_norm_kernel.rms_norm,
        rms_norm_rows_per_program=rms_norm_kernel.rms_norm_rows_per_program,
        attention=attention_kernel.attention,
        logprobs=logprobs_kernel.logprobs,
        routing=routing_kernel.routing,
    )


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_linear_kernel(ik):
    g = _gen()
    w = torch.randn(40, 48, generator=g).bfloat16()
    bias = torch.randn(40, generator=g).bfloat16()
    x = torch.randn(33, 48, generator=g).bfloat16()
    full = ik.linear(x, w, bias, torch.float32)
    for n in (1, 2, 3, 8):
        assert_bitwise_equal(ik.linear(x[:n], w, bias, torch.float32), full[:n], f"linear m={n}")
    assert_bitwise_equal(ik.linear(x[20:21], w, bias, torch.float32), full[20:21], "linear row 20")
    ref = cpu.linear(x, w, bias, torch.float32)
    assert (full - ref).abs().max() <= 1e-5 * (1 + ref.abs().max())


def test_rms_norm_kernel(ik):
    g = _gen(1)
    x = torch.randn(33, 96, generator=g).bfloat16()
    r = torch.randn(33, 96, generator=g).bfloat16()
    w = torch.randn(96, generator=g).bfloat16()
    y, h = ik.rms_norm(x, w, r, 1e-6)
    for n in (1, 2, 3, 8):
        yn, _ = ik.rms_norm(x[:n], w, r[:n], 1e-6)
        assert_bitwise_equal(yn, y[:n], f"rms_norm m={n}")
    y_ref, h_ref = cpu.rms_norm(x, w, r, 1e-6)
    assert_bitwise_equal(h, h_ref, "residual sum")
    assert bool(((y.float() - y_ref.float()).abs() <= y_ref.float().abs() * 2**-7 + 1e-6).all())


def test_rms_norm_rows_per_program_keep_the_bits(ik, monkeypatch):
    """Short rows (the q / k norms' head_dim) are taken several per program, each with the
    one-row code: the same bits as one row per program, the last program's rows past R masked."""
    g = _gen(2)
    x = torch.randn(37, 128, generator=g).bfloat16()
    w = torch.randn(128, generator=g).bfloat16()
    assert ik.rms_norm_rows_per_program(128) == 16 and ik.rms_norm_rows_per_program(2048) == 1
    many = ik.rms_norm(x, w, None, 1e-6)[0]
    from fp4_compile.codegen.invariant import rms_norm_kernel

    monkeypatch.setattr(rms_norm_kernel, "rms_norm_rows_per_program", lambda block: 1)
    assert_bitwise_equal(many, ik.rms_norm(x, w, None, 1e-6)[0], "16 rows vs 1 row per program")


def test_rms_norm_reads_row_blocks_in_place(ik, monkeypatch):
    """A fused q/k/v GEMM's q and k viewed as heads ([B, 1, heads, D], rows strided by the
    GEMM's width): the kernel reads them in place (`runtime.row_blocks`, no copy of x), with the
    same bits as the contiguous copy; the last program's rows past R masked."""
    from fp4_compile.codegen.runtime import row_blocks

    g = _gen(3)
    heads, kv_heads, d = 5, 2, 128
    qkv = torch.randn(7, 1, (heads + 2 * kv_heads) * d, generator=g).bfloat16()
    q = qkv[..., : heads * d].view(7, 1, heads, d)
    k = qkv[..., heads * d : (heads + kv_heads) * d].view(7, 1, kv_heads, d)
    w = torch.randn(d, generator=g).bfloat16()
    copies = []
    contiguous = torch.Tensor.contiguous

    def counting(t, *args, **kwargs):
        copies.append(not t.is_contiguous())
        return contiguous(t, *args, **kwargs)

    for name, x in (("q", q), ("k", k)):
        assert row_blocks(x) == (x.shape[-2], qkv.shape[-1]), name
        want = ik.rms_norm(x.contiguous(), w, None, 1e-6)[0]
        copies.clear()
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "contiguous", counting)
            got = ik.rms_norm(x, w, None, 1e-6)[0]
        assert not any(copies), f"{name}: x was copied"
        assert_bitwise_equal(got, want, f"{name} read in place vs its contiguous copy")
    assert row_blocks(q.contiguous()) is None and row_blocks(q.transpose(-1, -2)) is None


def _qkv(b, t, seed=0, hq=4, hkv=2, d=16):
    g = _gen(seed)
    return tuple(torch.randn(b, h, t, d, generator=g).bfloat16() for h in (hq, hkv, hkv))


def test_attention_kernel_decode_prefill_full(ik):
    q, k, v = _qkv(2, 40)
    b = q.shape[0]
    zeros, full_len = torch.zeros(b, dtype=torch.int64), torch.full((b,), 40)
    out, lse = ik.attention(q, k, v, zeros, full_len, None, True, 0.25)
    ref, ref_lse = cpu.attention(q, k, v, zeros, full_len, None, True, 0.25)
    assert (out.float() - ref.float()).abs().max() <= 2 * 2**-8 * (1 + ref.float().abs().max())
    assert (lse - ref_lse).abs().max() <= 1e-5 * (1 + ref_lse.abs().max())
    for t in (0, 15, 16, 17, 39):  # across the interpreter's BLOCK_N = 16 boundaries
        pos = torch.full((b,), t)
        dec, _ = ik.attention(q[:, :, t : t + 1], k, v, pos, pos + 1, None, True, 0.25)
        assert_bitwise_equal(dec, out[:, :, t : t + 1], f"decode t={t}")
    start = 0
    for n in (7, 20, 13):
        st = torch.full((b,), start)
        part, _ = ik.attention(q[:, :, start : start + n], k, v, st, st + n, None, True, 0.25)
        assert_bitwise_equal(part, out[:, :, start : start + n], f"chunk at {start}")
        start += n


def test_attention_kernel_ragged_and_batch(ik):
    lengths = torch.tensor([5, 40, 17])
    q, k, v = _qkv(3, 40, seed=2)
    k[0, :, 5:], v[0, :, 5:] = float("nan"), float("inf")  # stale slots past kv_len
    zeros = torch.zeros(3, dtype=torch.int64)
    out, _ = ik.attention(q, k, v, zeros, lengths, None, True, 0.25)
    for i in range(3):
        n = int(lengths[i])
        one = torch.tensor([n])
        alone, _ = ik.attention(
            q[i : i + 1, :, :n],
            k[i : i + 1, :, :n],
            v[i : i + 1, :, :n],
            torch.zeros(1, dtype=torch.int64),
            one,
            None,
            True,
            0.25,
        )
        assert_bitwise_equal(out[i : i + 1, :, :n], alone, f"ragged seq {i}")
        last = one - 1
        dec, _ = ik.attention(
            q[i : i + 1, :, n - 1 : n], k[i : i + 1], v[i : i + 1], last, one, None, True, 0.25
        )
        assert_bitwise_equal(dec, out[i : i + 1, :, n - 1 : n], f"ragged decode {i}")
    mask = (torch.arange(40)[None, :] < lengths[:, None])[:, None, None, :].expand(3, 1, 40, 40)
    masked, _ = ik.attention(q, k, v, zeros, torch.full((3,), 40), mask, True, 0.25)
    assert_bitwise_equal(masked[1:2], out[1:2], "mask == kv_len")


def test_logprobs_kernel(ik):
    g = _gen(3)
    logits = (torch.randn(33, 700, generator=g) * 3).bfloat16()
    tokens = torch.randint(0, 700, (33,), generator=g)
    lp, ent = ik.logprobs(logits, tokens, 0.8)
    for n in (1, 2, 3, 8):
        lpn, entn = ik.logprobs(logits[:n], tokens[:n], 0.8)
        assert_bitwise_equal(lpn, lp[:n], f"logp m={n}")
        assert_bitwise_equal(entn, ent[:n], f"entropy m={n}")
    ref_lp, ref_ent = cpu.logprobs(logits, tokens, 0.8)
    assert (lp - ref_lp).abs().max() <= 1e-5 * (1 + ref_lp.abs().max())
    assert (ent - ref_ent).abs().max() <= 1e-5 * (1 + ref_ent.abs().max())


def test_routing_kernel(ik):
    g = _gen(4)
    logits = (torch.randn(37, 128, generator=g) * 2).bfloat16()
    for norm in (True, False):
        w, idx = ik.routing(logits, 8, norm)
        for n in (1, 2, 5):
            wn, idn = ik.routing(logits[:n], 8, norm)
            assert_bitwise_equal(wn, w[:n], f"weights m={n}")
            assert torch.equal(idn, idx[:n]), n
        ref_w, ref_idx = cpu.routing(logits, 8, norm)
        assert torch.equal(idx, ref_idx)
        assert (w - ref_w).abs().max() <= 2e-6
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    w, idx = ik.routing(ties, 3, False)
    assert idx.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert torch.allclose(w[1], torch.full((3,), 0.2))
    with pytest.raises(ValueError, match="top_k"):
        ik.routing(ties, 6, True)


def test_attention_kernel_reads_projection_layouts_in_place(ik):
    """q, k, v as the projections hand them (transposes of [B, T, H, D]) and int32 positions:
    the same bits as contiguous copies and int64 positions (the kernel reads through strides)."""
    q, k, v = _qkv(2, 40, seed=5)
    b = q.shape[0]
    zeros, lens = torch.zeros(b, dtype=torch.int64), torch.tensor([40, 27])
    q_t, k_t, v_t = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not q_t.is_contiguous() and k_t.stride() == v_t.stride()
    got = ik.attention(q_t, k_t, v_t, zeros.int(), lens.int(), None, True, 0.25)
    want = ik.attention(q, k, v, zeros, lens, None, True, 0.25)
    assert_bitwise_equal(got[0], want[0], "out")
    assert_bitwise_equal(got[1], want[1], "lse")
    with pytest.raises(ValueError, match=r"q_start must be int32/int64 \[B\]"):
        ik.attention(q, k, v, zeros.float(), lens, None, True, 0.25)


def test_rms_norm_pair_reads_row_blocks_in_place(ik, monkeypatch):
    """The q / k norm pair (`rms_norm_pair`) on a fused q/k/v GEMM's q and k at batch > 1 reads
    both in place like `rms_norm` (no copy), with the bits of the two single norms."""
    from fp4_compile.codegen.invariant import rms_norm_kernel

    g = _gen(4)
    heads, kv_heads, d = 5, 2, 128
    qkv = torch.randn(7, 1, (heads + 2 * kv_heads) * d, generator=g).bfloat16()
    q = qkv[..., : heads * d].view(7, 1, heads, d)
    k = qkv[..., heads * d : (heads + kv_heads) * d].view(7, 1, kv_heads, d)
    wq, wk = torch.randn(2, d, generator=g).bfloat16()
    want = (
        ik.rms_norm(q.contiguous(), wq, None, 1e-6)[0],
        ik.rms_norm(k.contiguous(), wk, None, 1e-6)[0],
    )
    copies = []
    contiguous = torch.Tensor.contiguous

    def counting(t, *args, **kwargs):
        copies.append(not t.is_contiguous())
        return contiguous(t, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "contiguous", counting)
        got = rms_norm_kernel.rms_norm_pair(q, wq, k, wk, 1e-6)
    assert not any(copies), "q or k was copied"
    assert_bitwise_equal(got[0], want[0], "q read in place vs its contiguous copy")
    assert_bitwise_equal(got[1], want[1], "k read in place vs its contiguous copy")
