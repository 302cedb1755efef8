"""Batch-invariant linear, rms_norm, logprobs and routing on CPU (the reference kernels).

Contracts: (1) bitwise batch invariance: a row computed alone equals the same row inside
batches of 2, 3, 8 and 33 rows at the first, a middle and the last position; (2) accuracy within
an error budget derived from a float64 oracle: the error of an independent implementation
(stock PyTorch at the same precision) times a small factor, never a loosened tolerance;
(3) opcheck; (4) bad input raises a clear error naming the argument.
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.invariant import api as inv
from fp4_compile.testing import assert_bitwise_equal

BATCH_SIZES = (2, 3, 8, 33)


def _embed(row: torch.Tensor, n: int, pos: int, gen: torch.Generator) -> torch.Tensor:
    """A batch of n rows (random others) with `row` at index pos."""
    batch = (torch.randn((n, *row.shape), generator=gen) * 3).to(row.dtype)
    batch[pos] = row
    return batch


def _check_invariant(fn, rows: torch.Tensor, what: str) -> None:
    gen = torch.Generator().manual_seed(1)
    alone = [fn(rows[i : i + 1]) for i in range(rows.shape[0])]
    for n in BATCH_SIZES:
        for pos in sorted({0, n // 2, n - 1}):
            for i in range(rows.shape[0]):
                out = fn(_embed(rows[i], n, pos, gen))
                assert_bitwise_equal(
                    out[pos : pos + 1], alone[i], f"{what} row {i}, batch {n} @ {pos}"
                )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_batch_invariant(dtype):
    """Bitwise: linear (FP32 and rounded outputs, with bias) rows alone == rows in batches."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 96, generator=g).to(dtype)
    b = torch.randn(200, generator=g).to(dtype)
    rows = torch.randn(3, 96, generator=g).to(dtype)
    _check_invariant(lambda x: inv.linear(x, w, b, out_dtype=torch.float32), rows, "linear fp32")
    _check_invariant(lambda x: inv.linear(x, w), rows, "linear")


def test_linear_accuracy_and_3d():
    """Budget: |inv - fp64| <= 2 x |torch fp32 matmul - fp64| + 1 ulp-level floor."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 256, generator=g).bfloat16()
    w = torch.randn(130, 256, generator=g).bfloat16()
    y = inv.linear(x, w, out_dtype=torch.float32)
    oracle = x.double() @ w.double().t()
    stock = (x.float() @ w.float().t()).double()
    budget = 2 * (stock - oracle).abs().max() + 1e-6
    assert (y.double() - oracle).abs().max() <= budget
    assert y.shape == (4, 7, 130)
    assert_bitwise_equal(inv.mm(x[0], w.t(), out_dtype=torch.float32), y[0], "mm vs linear")


def test_linear_autograd_matches_fp64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 32, generator=g, requires_grad=True)
    w = torch.randn(24, 32, generator=g, requires_grad=True)
    b = torch.randn(24, generator=g, requires_grad=True)
    gy = torch.randn(5, 24, generator=g)
    inv.linear(x, w, b).backward(gy)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    torch.nn.functional.linear(xd, wd, bd).backward(gy.double())
    for got, ref in ((x.grad, xd.grad), (w.grad, wd.grad), (b.grad, bd.grad)):
        assert (got.double() - ref).abs().max() <= 1e-4


def _rms_ref(x, w, eps):
    x32 = x.float()
    y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return w * y


@pytest.mark.parametrize("hidden", [64, 96, 2048])
def test_rms_norm_invariant_and_accurate(hidden):
    """Bitwise invariance (with and without residual); vs transformers' formula: equal or one
    bf16 rounding apart (both take the FP32 mean, in different orders)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(hidden, generator=g).bfloat16()
    rows = torch.randn(3, hidden, generator=g).bfloat16()
    res = torch.randn(3, hidden, generator=g).bfloat16()
    _check_invariant(lambda x: inv.rms_norm(x, w, 1e-6), rows, "rms_norm")
    _check_invariant(lambda x: inv.rms_norm(x, w, 1e-6, residual=x * 0.5)[0], rows, "add_rms_norm")
    y, h = inv.rms_norm(rows, w, 1e-6, residual=res)
    assert_bitwise_equal(h, rows + res, "residual sum")
    ref = _rms_ref(h, w, 1e-6).float()
    ulp = ref.abs().clamp(min=1e-3) * 2**-7
    assert bool(((y.float() - ref).abs() <= ulp).all())


def test_rms_norm_backward_vs_fp64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 48, generator=g, requires_grad=True)
    r = torch.randn(6, 48, generator=g, requires_grad=True)
    w = torch.randn(48, generator=g, requires_grad=True)
    gy = torch.randn(6, 48, generator=g)
    gh = torch.randn(6, 48, generator=g)
    y, h = inv.rms_norm(x, w, 1e-5, residual=r)
    (y * gy + h * gh).sum().backward()
    xd, rd, wd = (t.detach().double().requires_grad_() for t in (x, r, w))
    hd = xd + rd
    yd = wd * (hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-5))
    (yd * gy.double() + hd * gh.double()).sum().backward()
    for got, ref in ((x.grad, xd.grad), (r.grad, rd.grad), (w.grad, wd.grad)):
        assert (got.double() - ref).abs().max() <= 1e-4 * (1 + ref.abs().max())


@pytest.mark.parametrize("vocab", [100, 2000, 5000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_invariant_and_accurate(vocab, temperature):
    """Bitwise invariance of (logp, entropy); vs float64: within 4x the error of
    torch.log_softmax(logits.float() / T) (FP32 rounding) plus an FP32-ulp floor."""
    g = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(40, vocab, generator=g) * 4).bfloat16()
    tokens = torch.randint(0, vocab, (40,), generator=g)

    def both(x, t):
        lp, ent = inv.logprobs(x, t, temperature)
        return torch.stack([lp, ent], -1)

    rows, toks = logits[:3], tokens[:3]
    alone = [both(rows[i : i + 1], toks[i : i + 1]) for i in range(3)]
    for n in BATCH_SIZES:
        for i in range(3):
            pos = n - 1 - (i % n)
            x, t = logits[:n].clone(), tokens[:n].clone()
            x[pos], t[pos] = rows[i], toks[i]
            assert_bitwise_equal(both(x, t)[pos : pos + 1], alone[i], f"logprobs batch {n}")
    lp, ent = inv.logprobs(logits, tokens, temperature)
    ref = torch.log_softmax(logits.double() / temperature, -1)
    ref_lp = ref.gather(-1, tokens[:, None])[:, 0]
    ref_ent = -(ref.exp() * ref).sum(-1)
    stock = torch.log_softmax(logits.float() / temperature, -1).gather(-1, tokens[:, None])[:, 0]
    floor = 4 * 2**-23 * (1 + ref_lp.abs().max())
    assert (lp.double() - ref_lp).abs().max() <= 4 * (stock.double() - ref_lp).abs().max() + floor
    assert (ent.double() - ref_ent).abs().max() <= 1e-5 * (1 + ref_ent.abs().max())
    assert lp.dtype == ent.dtype == torch.float32


def test_logprobs_grad_vs_fp64():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 3, 300, generator=g) * 2).requires_grad_()
    tokens = torch.randint(0, 300, (2, 3), generator=g)
    glp, gent = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)
    lp, ent = inv.logprobs(logits, tokens, 0.8)
    (lp * glp + ent * gent).sum().backward()
    xd = logits.detach().double().requires_grad_()
    ref = torch.log_softmax(xd / 0.8, -1)
    (
        (ref.gather(-1, tokens[..., None])[..., 0] * glp) - (ref.exp() * ref).sum(-1) * gent
    ).sum().backward()
    assert (logits.grad.double() - xd.grad).abs().max() <= 1e-5


def test_routing_ties_and_renorm():
    """Ties go to the lower expert index; norm_topk_prob renormalizes like Qwen3-MoE."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    w, idx = inv.route(logits, 2)
    assert idx.tolist() == [[1, 2], [0, 1]]
    assert torch.allclose(w, torch.full((2, 2), 0.5))
    w3, idx3 = inv.route(logits, 3, norm_topk_prob=False)
    assert idx3.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert torch.allclose(w3[1], torch.full((3,), 0.2))


def test_routing_invariant_accurate_and_sort():
    g = torch.Generator().manual_seed(0)
    x_rows = torch.randn(3, 64, generator=g).bfloat16()
    router = torch.randn(16, 64, generator=g).bfloat16()

    def wi(x):
        w, i = inv.route(inv.linear(x, router), 4)
        return torch.cat([w, i.to(torch.float32)], -1)

    _check_invariant(wi, x_rows, "routing")
    logits = inv.linear(torch.randn(50, 64, generator=g).bfloat16(), router)
    w, idx = inv.route(logits, 4)
    p = torch.softmax(logits.double(), -1)
    top = p.gather(-1, idx)
    assert (w.double() - top / top.sum(-1, keepdim=True)).abs().max() <= 1e-6
    order, offsets = inv.sort_by_expert(idx, 16)
    assert offsets.dtype == torch.int32 and int(offsets[-1]) == idx.numel()
    flat = idx.reshape(-1)[order]
    assert bool((flat[1:] >= flat[:-1]).all())
    starts = torch.cat([offsets.new_zeros(1), offsets[:-1]])
    for e in range(16):
        assert bool((flat[int(starts[e]) : int(offsets[e])] == e).all())


def test_routing_grad_vs_fp64():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 8, generator=g, requires_grad=True)
    gw = torch.randn(6, 2, generator=g)
    w, idx = inv.route(logits, 2)
    (w * gw).sum().backward()
    xd = logits.detach().double().requires_grad_()
    p = torch.softmax(xd, -1).gather(-1, idx)
    ((p / p.sum(-1, keepdim=True)) * gw.double()).sum().backward()
    assert (logits.grad.double() - xd.grad).abs().max() <= 1e-6


def test_opcheck():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 32, generator=g).bfloat16()
    w = torch.randn(8, 32, generator=g).bfloat16()
    nw = torch.randn(32, generator=g)
    ops = torch.ops.fp4_compile
    torch.library.opcheck(ops.invariant_linear, (x, w, None, torch.float32))
    torch.library.opcheck(
        ops.invariant_linear, (x.float().requires_grad_(), w.float(), None, torch.float32)
    )
    xf = torch.randn(4, 32, generator=g, requires_grad=True)
    torch.library.opcheck(ops.invariant_rms_norm, (xf, nw.requires_grad_(), 1e-6))
    torch.library.opcheck(ops.invariant_add_rms_norm, (xf, torch.randn(4, 32), None, 1e-6))
    logits = torch.randn(5, 50, generator=g, requires_grad=True)
    torch.library.opcheck(ops.invariant_logprobs, (logits, torch.randint(0, 50, (5,)), 0.9))
    torch.library.opcheck(ops.invariant_routing, (torch.randn(5, 8, requires_grad=True), 2, True))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: inv.linear(torch.ones(2, 3), torch.ones(4, 5)), "x's last dim"),
        (lambda: inv.linear(torch.ones(2, 3), torch.ones(4, 3).bfloat16()), "same dtype"),
        (
            lambda: inv.linear(torch.ones(2, 3, dtype=torch.int32), torch.ones(4, 3)),
            "x must have dtype",
        ),
        (lambda: inv.rms_norm(torch.ones(2, 3), torch.ones(4), 1e-6), "weight must be"),
        (lambda: inv.rms_norm(torch.ones(2, 3), None, -1.0), "eps"),
        (lambda: inv.logprobs(torch.ones(2, 3), torch.zeros(2)), "tokens must be"),
        (
            lambda: inv.logprobs(torch.ones(2, 3), torch.zeros(3, dtype=torch.int64)),
            "leading shape",
        ),
        (
            lambda: inv.logprobs(torch.ones(2, 3), torch.zeros(2, dtype=torch.int64), 0.0),
            "temperature",
        ),
        (lambda: inv.route(torch.ones(2, 3), 4), "top_k"),
        (lambda: inv.sort_by_expert(torch.zeros(2, 2), 4), "experts_MK"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
