"""The Triton attention backward (`codegen/invariant/attention_backward_kernel.py`): compiled on
CUDA, else in the Triton interpreter (conftest sets TRITON_INTERPRET=1 without a GPU).

Contracts: dq, dk, dv within 2x the error of stock SDPA's bf16 backward against float64 autograd
(the budget of `test_invariant_attention.test_backward_vs_fp64`), over causal / ragged kv_len /
GQA / mask / a query offset; bitwise run to run; zero gradients for dead key slots; in the
interpreter (FP32 dots) within the FP32-reference's own error plus one bf16 ulp.
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.invariant import reference as cpu
from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and not interpreting(), reason="needs CUDA or the interpreter"
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def ab():
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant import attention_backward_kernel as attention_backward

    return attention_backward


def _inputs(b, hq, hkv, tq, tk, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, tq, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, tk, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, tk, d, generator=g).bfloat16()
    go = torch.randn(b, hq, tq, d, generator=g).bfloat16()
    return q, k, v, go


def _fp64_grads(q, k, v, go, vis, scale, dtype):
    """Autograd of softmax attention in `dtype` (float64 oracle) over visible keys."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    a, bk, c = leaves
    g = a.shape[1] // bk.shape[1]
    s = (a @ bk.repeat_interleave(g, 1).transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(~vis, float("-inf")), -1).nan_to_num(0.0)
    (p @ c.repeat_interleave(g, 1)).backward(go.to(dtype))
    return [t.grad.double() for t in leaves]


CASES = {
    # name: (b, hq, hkv, tq, tk, d, q_start, kv_len, causal, masked)
    "causal_ragged_gqa": (2, 4, 2, 45, 45, 32, [0, 0], [45, 30], True, False),
    "causal_offset": (2, 4, 1, 20, 50, 32, [30, 10], [50, 30], True, False),
    "masked_noncausal": (2, 2, 2, 33, 40, 16, [0, 0], [40, 37], False, True),
}


def _case_tensors(name):
    """(go, q, k, v, out, lse, q_start, kv_len, mask) on the CPU (the forward by the CPU
    reference), causal, scale: the arguments of `attention_backward` for CASES[name]."""
    b, hq, hkv, tq, tk, d, qs, kl, causal, masked = CASES[name]
    q, k, v, go = _inputs(b, hq, hkv, tq, tk, d, seed=len(name))
    q_start, kv_len = torch.tensor(qs), torch.tensor(kl)
    mask = None
    if masked:
        mask = torch.rand(b, 1, tq, tk, generator=torch.Generator().manual_seed(3)) < 0.7
    scale = d**-0.5
    out, lse = cpu.attention(q, k, v, q_start, kv_len, mask, causal, scale)
    return (go, q, k, v, out, lse, q_start, kv_len, mask), causal, scale


def _on_device(tensors):
    return [t.to(DEV) if isinstance(t, torch.Tensor) else t for t in tensors]


def _run_case(ab, name):
    b, hq, _, tq, tk, *_ = CASES[name]
    tensors, causal, scale = _case_tensors(name)
    go, q, k, v, out, lse, q_start, kv_len, mask = tensors
    vis = cpu.visible_keys(q_start, kv_len, mask, causal, tq, tk).expand(b, hq, tq, tk)
    args = _on_device(tensors)
    got = ab.attention_backward(*args, causal, scale)
    again = ab.attention_backward(*args, causal, scale)
    for name_, a, b_ in zip("qkv", got, again):
        assert_bitwise_equal(a, b_, f"d{name_} run to run")
    ref = cpu.attention_backward(go, q, k, v, out, lse, q_start, kv_len, mask, causal, scale)
    oracle = _fp64_grads(q, k, v, go, vis, scale, torch.float64)
    stock = _fp64_grads(q, k, v, go, vis, scale, torch.bfloat16)
    return [t.cpu() for t in got], ref, oracle, stock, kv_len


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_within_stock_budget(ab, name):
    got, _, oracle, stock, _ = _run_case(ab, name)
    for n, g, o, s in zip("qkv", got, oracle, stock):
        assert g.dtype == torch.bfloat16
        err, budget = (g.double() - o).abs().max(), 2 * (s - o).abs().max()
        assert err <= budget, f"{name} d{n}: error {err:.3g} over budget {budget:.3g}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_dead_key_slots_get_zeros(ab, name):
    got, _, _, _, kv_len = _run_case(ab, name)
    for n, g in zip("kv", got[1:]):
        for i, n_live in enumerate(kv_len.tolist()):
            assert bool((g[i, :, n_live:] == 0).all()), f"{name} d{n}: slots past kv_len"


def _fp32_error_bound(name):
    """A-priori bound (float64) on the FP32 backward's rounding error per element of dq, dk, dv:
    dS = P * (dP - delta), dP = dO V^T and delta = rowsum(dO * O) each an FP32 sum of D products,
    so |err(dS)| <~ c * P * (|dO| |V|^T + rowsum(|dO| |O|)); dq = scale dS K, dk = scale dS^T Q
    and dv = P^T dO are FP32 sums over keys / queries of such terms. c = (D + T + 8) u (1 +
    max |scaled score|): the dot lengths, and P's own relative error from its FP32 score.
    Where dP and delta cancel (a query that sees one key: P = 1 and dP = delta exactly) the FP32
    dS is this rounding noise, its sign included; no bound relative to the value holds there."""
    b, hq, hkv, tq, tk, d, qs, kl, causal, masked = CASES[name]
    q, k, v, go = (t.double() for t in _inputs(b, hq, hkv, tq, tk, d, seed=len(name)))
    mask = None
    if masked:
        mask = torch.rand(b, 1, tq, tk, generator=torch.Generator().manual_seed(3)) < 0.7
    scale = d**-0.5
    vis = cpu.visible_keys(torch.tensor(qs), torch.tensor(kl), mask, causal, tq, tk)
    vis = vis.expand(b, hq, tq, tk)
    group = hq // hkv
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ kk.transpose(-1, -2) * scale
    p = torch.softmax(scores.masked_fill(~vis, float("-inf")), -1).nan_to_num(0.0)
    o = p @ vv
    ds_abs = p * (
        go.abs() @ vv.abs().transpose(-1, -2) + (go.abs() * o.abs()).sum(-1, keepdim=True)
    )
    smax = float(scores.masked_fill(~vis, 0.0).abs().max())
    c = (d + max(tq * group, tk) + 8) * 2.0**-24 * (1 + smax)

    def per_kv_head(t):  # the query heads of one key / value head add up
        return t.reshape(b, hkv, group, *t.shape[2:]).sum(2)

    dq = (ds_abs @ kk.abs()) * scale * c
    dk = per_kv_head(ds_abs.transpose(-1, -2) @ q.abs()) * scale * c
    dv = per_kv_head(p.transpose(-1, -2) @ go.abs()) * c
    return dq, dk, dv


@pytest.mark.skipif(torch.cuda.is_available(), reason="FP32 dots only in the interpreter")
@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreter_matches_fp32_reference(ab, name):
    """FP32 dots: the kernel and the reference differ only in accumulation order, so after the
    bf16 rounding they are at most one bf16 ulp (of the value) apart plus twice the FP32
    backward's own rounding-error bound (`_fp32_error_bound`: each side's error is within it;
    it matters only where dP - delta cancels)."""
    got, ref, _, _, _ = _run_case(ab, name)
    for n, g, r, e in zip("qkv", got, ref, _fp32_error_bound(name)):
        ulp = torch.maximum(r.float().abs(), g.float().abs()).double() * 2**-7 + 1e-30
        assert bool(((g.double() - r.double()).abs() <= ulp + 2 * e).all()), f"{name} d{n}"


def test_bad_head_dim(ab):
    q, k, v, go = (t.to(DEV) for t in _inputs(1, 2, 2, 4, 4, 24, seed=0))
    z = torch.zeros(1, dtype=torch.int64, device=DEV)
    lse = torch.zeros(1, 2, 4, device=DEV)
    with pytest.raises(ValueError, match="power-of-two head dim"):
        ab.attention_backward(go, q, k, v, q, lse, z, z + 4, None, True, 0.2)


@pytest.mark.parametrize("name", ["causal_ragged_gqa", "masked_noncausal"])
def test_transposed_grad_out_is_read_in_place(ab, name):
    """dO as autograd hands it (the transpose of [B, Tq, Hq, D], not contiguous) gives the same
    bits as its contiguous copy: the kernels read it through its own strides."""
    (go, *rest), causal, scale = _case_tensors(name)
    rest = _on_device(rest)
    go_t = go.transpose(1, 2).contiguous().to(DEV).transpose(1, 2)  # [B, Hq, Tq, D] view
    assert not go_t.is_contiguous()
    got = ab.attention_backward(go_t, *rest, causal, scale)
    want = ab.attention_backward(go_t.contiguous(), *rest, causal, scale)
    for n, a, w in zip("qkv", got, want):
        assert_bitwise_equal(a, w, f"{name} d{n}")


@pytest.mark.parametrize("name", ["causal_ragged_gqa", "masked_noncausal"])
def test_transposed_q_and_out_are_read_in_place(ab, name):
    """q as the projections hand it (the transpose of [B, Tq, Hq, D]) and O in another layout
    give the same bits as their contiguous copies, and dq comes back contiguous: the kernels
    read q and O and write dq through their own strides."""
    (go, q, k, v, out, *rest), causal, scale = _case_tensors(name)
    go, q, k, v, out, *rest = _on_device([go, q, k, v, out, *rest])
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, Hq, Tq, D] view
    out_t = out.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q_t.is_contiguous() and not out_t.is_contiguous()
    got = ab.attention_backward(go, q_t, k, v, out_t, *rest, causal, scale)
    want = ab.attention_backward(go, q, k, v, out, *rest, causal, scale)
    assert got[0].is_contiguous()
    for n, a, w in zip("qkv", got, want):
        assert_bitwise_equal(a, w, f"{name} d{n}")


@pytest.mark.parametrize("name", ["causal_ragged_gqa", "masked_noncausal"])
def test_transposed_k_and_v_and_int32_positions(ab, name):
    """k and v in the projections' layout (one transposed set of strides, shared), positions as
    int32: the same bits as contiguous k, v and int64 positions; dk, dv come back contiguous."""
    (go, q, k, v, out, lse, q_start, kv_len, mask), causal, scale = _case_tensors(name)
    go, q, k, v, out, lse, q_start, kv_len, mask = _on_device(
        [go, q, k, v, out, lse, q_start, kv_len, mask]
    )
    k_t = k.transpose(1, 2).contiguous().transpose(1, 2)
    v_t = v.transpose(1, 2).contiguous().transpose(1, 2)
    assert k_t.stride() == v_t.stride() and not k_t.is_contiguous()
    got = ab.attention_backward(
        go, q, k_t, v_t, out, lse, q_start.int(), kv_len.int(), mask, causal, scale
    )
    want = ab.attention_backward(go, q, k, v, out, lse, q_start, kv_len, mask, causal, scale)
    assert got[1].is_contiguous() and got[2].is_contiguous()
    for n, a, w in zip("qkv", got, want):
        assert_bitwise_equal(a, w, f"{name} d{n}")
