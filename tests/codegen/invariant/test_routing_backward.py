"""The one-launch routing backward kernel (`codegen/invariant/routing_backward_kernel.py`), in the
Triton interpreter on CPU or compiled on CUDA.

Contracts: (1) error budget: within an a-priori FP32 rounding bound (`_fp32_error_bound`,
derived, not tuned) of the formula evaluated in float64, for norm_topk_prob True and False,
float32 and bfloat16 logits, duplicate expert ids; (2) bitwise: a row alone == the same row in
batches of several sizes and positions, two calls == each other, strided inputs == contiguous
copies; (3) bad input raises a clear error naming the argument; an out-of-range expert id
turns its row NaN (no host check); (4) on CUDA the op dispatches to the kernel.
"""

from __future__ import annotations

import os

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
U = 2.0**-24  # FP32 unit roundoff


@pytest.fixture(scope="module")
def rb():
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant import routing_backward_kernel

    return routing_backward_kernel


def _inputs(m, num_experts, top_k, dtype, seed=0):
    """(grad_w FP32 [m, k], logits [m, E] in dtype, idx int64 [m, k]) on DEV: row 0's ids are
    its top-k (distinct), the others random, with repeats forced into rows 1 and 2 (m > 2); the
    logits' spread grows with the row (|z - max z| up to ~25, far from subnormal exp)."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.linspace(0.5, 4.0, m)[:, None]
    logits = (torch.randn(m, num_experts, generator=g) * spread).to(dtype)
    idx = torch.randint(0, num_experts, (m, top_k), generator=g)
    idx[0] = logits[0].float().topk(top_k).indices
    if m > 2:
        idx[1, 1:] = idx[1, 0]  # every slot the same expert
        idx[2, top_k // 2] = idx[2, 0]
    grad_w = torch.randn(m, top_k, generator=g)
    return grad_w.to(DEV), logits.to(DEV), idx.to(DEV)


def _formula64(grad_w, logits, idx, norm):
    """The op's formula in float64 from the same inputs, and the magnitudes its FP32 rounding
    error scales with: G_j >= |g_j| after the renormalization, D_i = sum of G_j over the slots
    with id i, Q = sum_i D_i p_i."""
    z, g = logits.double().cpu(), grad_w.double().cpu()
    idx = idx.cpu()
    p = torch.softmax(z, -1)
    sel = p.gather(-1, idx)
    mag = g.abs()
    if norm:
        total = sel.sum(-1, keepdim=True)
        w = sel / total
        mag = (g.abs() + (g.abs() * w).sum(-1, keepdim=True)) / total
        g = (g - (g * w).sum(-1, keepdim=True)) / total
    dp = torch.zeros_like(p).scatter_add(-1, idx, g)
    dz = p * (dp - (dp * p).sum(-1, keepdim=True))
    d_mag = torch.zeros_like(p).scatter_add(-1, idx, mag)
    q_mag = (d_mag * p).sum(-1, keepdim=True)
    return dz, p, d_mag, q_mag


def _fp32_error_bound(grad_w, logits, idx, norm, levels):
    """A-priori bound (float64, first order in u = 2**-24) on |kernel's FP32 dz - exact dz|.

    exp: e_i = exp(z_i - m) within (4 + 3 |z_i - m|) u: 2 ulp of ex2.approx (the GPU; numpy in
    the interpreter is closer) and u each from z - m, log2(e) and the product, which scale by
    |z - m| in the exponent. Softmax: S sums e over a tree of `levels` (nonnegative terms),
    p_i = e_i / S, so dp_rel = (9 + 6 R + levels) u for R = max |z - m| of the row.
    sel_j = p[idx_j] exactly. Renormalization: T = sum of k sel, w_j = sel_j / T, gw = sum_j
    g_j w_j, g'_j = (g_j - gw) / T is within c_g G_j, c_g = 3 dp_rel + (3 k + 1) u (without it
    c_g = 0, G_j = |g_j|). dp_i sums <= k of them: within (c_g + k u) D_i. D = tree of dp p:
    within (c_g + k u + dp_rel + (levels + 1) u) Q. dz_i = p_i (dp_i - D) adds u for the
    difference and dp_rel + u for the product:
        |err dz_i| <= p_i (D_i + Q) (2 c_g + 2 dp_rel + (2 k + levels + 1) u).
    Valid while exp(z - m) stays normal (R < 87: the inputs keep R < 45)."""
    _, p, d_mag, q_mag = _formula64(grad_w, logits, idx, norm)
    z = logits.double().cpu()
    r = (z.amax(-1, keepdim=True) - z).amax(-1, keepdim=True)
    assert float(r.max()) < 80, "exp(z - max) would be subnormal: the bound does not cover it"
    k = idx.shape[-1]
    dp_rel = (9 + 6 * r + levels) * U
    c_g = 3 * dp_rel + (3 * k + 1) * U if norm else 0.0
    return p * (d_mag + q_mag) * (2 * c_g + 2 * dp_rel + (2 * k + levels + 1) * U)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_experts, top_k", [(40, 6), (128, 8)])
def test_matches_float64_formula(rb, norm, dtype, num_experts, top_k):
    """FP32 kernel vs the formula in float64: within `_fp32_error_bound`; a bfloat16 output adds
    its one rounding (<= 2**-8 of the value)."""
    grad_w, logits, idx = _inputs(21, num_experts, top_k, dtype)
    dz = rb.routing_backward(grad_w, logits, idx, norm)
    assert dz.dtype == dtype and dz.shape == logits.shape
    exact = _formula64(grad_w, logits, idx, norm)[0]
    err = _fp32_error_bound(grad_w, logits, idx, norm, rb.launch_shape(num_experts)[1])
    out_rel = 2.0**-8 if dtype == torch.bfloat16 else 0.0
    bound = err + out_rel * (exact.abs() + err)
    diff = (dz.cpu().double() - exact).abs()
    bad = diff > bound
    assert not bool(bad.any()), (
        f"{int(bad.sum())} of {dz.numel()} elements outside the bound; worst excess "
        f"{float((diff - bound).max()):.3e}"
    )


@pytest.mark.parametrize("norm", [True, False])
def test_rows_are_batch_invariant_and_deterministic(rb, norm):
    """A row alone == that row inside batches of 2, 5 and 33 at the first, a middle and the last
    position (the other rows random), bitwise; a second call == the first, bitwise."""
    grad_w, logits, idx = _inputs(33, 40, 6, torch.bfloat16, seed=1)
    full = rb.routing_backward(grad_w, logits, idx, norm)
    assert_bitwise_equal(rb.routing_backward(grad_w, logits, idx, norm), full, "rerun")
    for i in (0, 1, 2, 17, 32):
        alone = rb.routing_backward(grad_w[i : i + 1], logits[i : i + 1], idx[i : i + 1], norm)
        assert_bitwise_equal(alone, full[i : i + 1], f"row {i} alone vs batch 33")
        for n in (2, 5):
            g_b, x_b, i_b = _inputs(n, 40, 6, torch.bfloat16, seed=10 * i + n)
            for pos in sorted({0, n // 2, n - 1}):
                g_b[pos], x_b[pos], i_b[pos] = grad_w[i], logits[i], idx[i]
                out = rb.routing_backward(g_b, x_b, i_b, norm)
                assert_bitwise_equal(out[pos : pos + 1], alone, f"row {i}, batch {n} @ {pos}")


def test_strided_inputs_read_in_place(rb):
    """grad_w, idx and logits as column slices of wider tensors, and a column-major logits: the
    same bits as contiguous copies; the output takes logits' layout (`empty_like`, the fake's)."""
    grad_w, logits, idx = _inputs(9, 40, 6, torch.float32, seed=3)
    want = rb.routing_backward(grad_w, logits, idx, True)
    g_s = torch.cat([grad_w, grad_w], 1)[:, :6]
    i_s = torch.cat([idx, idx], 1)[:, :6]
    x_s = torch.cat([logits, logits], 1)[:, :40]
    x_t = logits.t().contiguous().t()
    for g, x, i in ((g_s, logits, idx), (grad_w, logits, i_s), (grad_w, x_s, idx)):
        assert not (g.is_contiguous() and x.is_contiguous() and i.is_contiguous())
        assert_bitwise_equal(rb.routing_backward(g, x, i, True), want, "strided")
    got = rb.routing_backward(grad_w, x_t, idx, True)
    assert got.stride() == x_t.stride()
    assert_bitwise_equal(got.contiguous(), want, "column-major logits")


def test_duplicate_ids_add(rb):
    """Slots naming the same expert add: four slots of one expert act as one slot with the sum
    of their gradients (no renormalization; the partial sums are exact, so bitwise)."""
    grad_w, logits, idx = _inputs(4, 16, 4, torch.float32, seed=4)
    idx[:] = idx[:, :1]
    grad_w = torch.tensor([[0.5, 0.25, -1.0, 2.0]] * 4, device=DEV)  # exact sums
    dup = rb.routing_backward(grad_w, logits, idx, False)
    one = rb.routing_backward(grad_w.sum(1, keepdim=True), logits, idx[:, :1], False)
    assert_bitwise_equal(dup, one, "duplicates == their sum in one slot")


def test_out_of_range_id_poisons_its_row(rb):
    """The forward never returns an id outside [0, E); one that is (it would select nothing)
    makes its row NaN instead of a silently wrong gradient, and leaves the other rows alone."""
    grad_w, logits, idx = _inputs(3, 16, 2, torch.float32, seed=5)
    want = rb.routing_backward(grad_w, logits, idx, True)
    for bad_id in (16, -1):
        idx_bad = idx.clone()
        idx_bad[1, 1] = bad_id
        got = rb.routing_backward(grad_w, logits, idx_bad, True)
        assert bool(got[1].isnan().all()), bad_id
        assert_bitwise_equal(got[0::2], want[0::2], "other rows")


@pytest.mark.parametrize(
    "args, error, match",
    [
        (lambda g, x, i: (g, torch.zeros(2, 4097, device=DEV), i), ValueError, "logits has E=4097"),
        (lambda g, x, i: (g, x.double(), i), TypeError, "logits must have dtype"),
        (lambda g, x, i: (g.double(), x, i), TypeError, "grad_w must have dtype"),
        (lambda g, x, i: (g, x, i.int()), TypeError, "idx must be int64"),
        (lambda g, x, i: (g, x[None], i), ValueError, r"logits must be \[M, E\]"),
        (lambda g, x, i: (g, x, i[:1]), ValueError, r"idx must be \[M=2"),
        (lambda g, x, i: (g[:, :1], x, i), ValueError, "grad_w must have idx's shape"),
    ],
)
def test_bad_input_names_the_argument(rb, args, error, match):
    grad_w, logits, idx = _inputs(2, 8, 2, torch.float32)
    with pytest.raises(error, match=match):
        rb.routing_backward(*args(grad_w, logits, idx), True)


def test_empty_batch(rb):
    grad_w, logits, idx = _inputs(2, 8, 2, torch.bfloat16)
    dz = rb.routing_backward(grad_w[:0], logits[:0], idx[:0], True)
    assert dz.shape == (0, 8) and dz.dtype == torch.bfloat16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the op uses the kernel on CUDA only")
def test_op_dispatches_to_the_kernel_on_cuda(rb):
    """On CUDA the op and the routing autograd give the kernel's bits; opcheck passes."""
    grad_w, logits, idx = _inputs(21, 128, 8, torch.float32, seed=6)
    ops = torch.ops.fp4_compile
    want = rb.routing_backward(grad_w, logits, idx, True)
    got = ops.invariant_routing_backward(grad_w, logits, idx, True)
    assert_bitwise_equal(got, want, "op vs kernel")
    x = logits.clone().requires_grad_()
    w, experts = ops.invariant_routing(x, 8, True)
    (w * grad_w).sum().backward()
    want = rb.routing_backward(grad_w, logits, experts, True)
    assert_bitwise_equal(x.grad, want, "autograd vs kernel")
    torch.library.opcheck(ops.invariant_routing_backward, (grad_w, logits, idx, True))
    torch.library.opcheck(ops.invariant_routing, (x.detach().requires_grad_(), 8, True))
