"""The row-chunked head + log-prob (`codegen/invariant/head_logprobs.py`).

Bitwise tier: at every chunk size (dividing the row count or not) the log-probs, entropies and
both gradients (hidden, head weight) equal those of one chunk over all rows; the log-probs and
entropies also equal the full-logits path (the lowering's BF16 head, then the shared op). The
gradient GEMMs are checked on the CPU path and, in the Triton interpreter, on the kernel path
(the invariant linear kernel continuing one K chain across chunks)."""

from __future__ import annotations

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen.invariant.head_logprobs import ROW_BLOCK, head_logprobs
from fp4_compile.testing import assert_bitwise_equal


def _case(rows: int, hidden: int, vocab: int, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (0.2 * torch.randn(vocab, hidden, generator=g)).to(dtype)
    tokens = torch.randint(0, vocab, (rows,), generator=g)
    g_lp = torch.randn(rows, generator=g)
    g_ent = torch.randn(rows, generator=g)
    return h, w, tokens, g_lp, g_ent


def _run(h, w, tokens, g_lp, g_ent, chunk, *, use_kernels, temperature=0.7):
    h = h.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    logp, ent = head_logprobs(h, w, tokens, temperature, chunk_rows=chunk, use_kernels=use_kernels)
    ((logp * g_lp).sum() + (ent * g_ent).sum()).backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_bitwise_cpu(dtype):
    rows = 3 * ROW_BLOCK + 37  # no chunk size below divides it
    args = _case(rows, 32, 300, dtype)
    ref = _run(*args, 4 * ROW_BLOCK, use_kernels=False)  # one chunk
    for chunk in (ROW_BLOCK, 2 * ROW_BLOCK, 3 * ROW_BLOCK):
        got = _run(*args, chunk, use_kernels=False)
        for name, a, b in zip(("logp", "entropy", "dhidden", "dweight"), got, ref):
            assert_bitwise_equal(a, b, f"{name} at chunk {chunk}")


def test_chunks_bitwise_kernels_interpreter():
    """The CUDA path's gradient GEMMs (invariant linear kernel, FP32 K chain continued across
    chunks), run in the interpreter."""
    import os

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or the Triton interpreter")
    rows = ROW_BLOCK + 40
    args = _case(rows, 16, 48, torch.float32, seed=1)
    ref = _run(*args, 2 * ROW_BLOCK, use_kernels=True)
    got = _run(*args, ROW_BLOCK, use_kernels=True)
    for name, a, b in zip(("logp", "entropy", "dhidden", "dweight"), got, ref):
        assert_bitwise_equal(a, b, f"kernel path {name}")
    # the kernel path computes the same math as the CPU path (different sum order)
    cpu = _run(*args, ROW_BLOCK, use_kernels=False)
    torch.testing.assert_close(got[2], cpu[2], rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(got[3], cpu[3], rtol=1e-2, atol=1e-3)


def test_forward_equals_full_logits_path():
    """The chunked forward is the full path's forward, row for row: the lowering's BF16 head over
    all rows, then the shared log-prob op."""
    h, w, tokens, *_ = _case(ROW_BLOCK + 5, 32, 200, torch.float32, seed=2)
    logits = torch.ops.fp4_compile.invariant_linear(
        h.to(torch.bfloat16), w.to(torch.bfloat16), None, h.dtype
    )
    full_lp, full_ent = torch.ops.fp4_compile.invariant_logprobs(logits, tokens, 0.7)
    lp, ent = head_logprobs(h, w, tokens, 0.7, chunk_rows=ROW_BLOCK)
    assert_bitwise_equal(lp, full_lp, "logp")
    assert_bitwise_equal(ent, full_ent, "entropy")


def test_gradients_match_full_graph_math():
    """Same math as the full-logits backward (bf16 head, `invariant_linear_backward`): close, not
    bitwise (another summation order of the two gradient GEMMs)."""
    h, w, tokens, g_lp, _ = _case(ROW_BLOCK + 5, 32, 200, torch.float32, seed=3)
    h1, w1 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    logits = torch.ops.fp4_compile.invariant_linear(
        h1.to(torch.bfloat16), w1.to(torch.bfloat16), None, h1.dtype
    )
    lp, _ = torch.ops.fp4_compile.invariant_logprobs(logits, tokens, 0.7)
    (lp * g_lp).sum().backward()
    h2, w2 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    lp2, _ = head_logprobs(h2, w2, tokens, 0.7, chunk_rows=ROW_BLOCK)
    (lp2 * g_lp).sum().backward()
    torch.testing.assert_close(h2.grad, h1.grad, rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("chunk", [0, 100, ROW_BLOCK + 1, "512"])
def test_bad_chunk_rows_named(chunk):
    h, w, tokens, *_ = _case(8, 16, 32, torch.float32)
    with pytest.raises(ValueError, match="chunk_rows"):
        head_logprobs(h, w, tokens, 1.0, chunk_rows=chunk)
