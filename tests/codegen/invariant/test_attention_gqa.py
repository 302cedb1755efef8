"""Grouped-query attention read in place: `fp4_compile::invariant_attention` on k, v with Hkv
heads (query head h reads KV head h // G, no copy) == the repeat-then-attend lowering it replaces
(k, v repeated per query head, then attention; the backward's per-head dK / dV summed over each
group in order r = 0..G-1 in FP32, one rounding to k's dtype), bitwise: forward (out, lse) and
gradients, for several (Hq, Hkv) groupings, odd lengths, batch rows of different kv_len, a
decode step against a static cache holding junk past each row's length, the rollout's mask, and
FP32 k, v (a model held in FP32: the group sum rounds once, to FP32).

The op runs the CPU reference here and the Triton kernels on CUDA; the kernels themselves are
also compared directly (compiled on CUDA, else in the Triton interpreter: conftest sets
TRITON_INTERPRET=1 without a GPU).
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
GROUPINGS = [(4, 2), (8, 1), (6, 3), (4, 4)]  # (Hq, Hkv)
OP = torch.ops.fp4_compile.invariant_attention.default


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _tensors(b, hq, hkv, tq, tk, d, seed):
    g = _gen(seed)
    q = torch.randn(b, hq, tq, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, tk, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, tk, d, generator=g).bfloat16()
    go = torch.randn(b, hq, tq, d, generator=g).bfloat16()
    return q, k, v, go


def _repeat(t, g):
    """transformers' repeat_kv: head h * g + r of the result is head h."""
    b, h, n, d = t.shape
    return t[:, :, None].expand(b, h, g, n, d).reshape(b, h * g, n, d)


def _group_sum(grad, g, dtype):
    """What the removed repeat_kv's backward computed: ((g0 + g1) + g2) + ... in FP32, one
    rounding to dtype."""
    b, hn, n, d = grad.shape
    parts = grad.reshape(b, hn // g, g, n, d)
    acc = parts[:, :, 0].float()
    for r in range(1, g):
        acc = acc + parts[:, :, r].float()
    return acc.to(dtype)


def _case(name, hq, hkv, d=32):
    """(q, k, v, go, q_start, kv_len, mask, causal) on DEV."""
    b = 3
    if name == "causal_ragged":  # the learner: odd length, rows of different kv_len
        q, k, v, go = _tensors(b, hq, hkv, 37, 37, d, seed=hq + hkv)
        qs, kl, mask, causal = [0, 0, 0], [37, 21, 5], None, True
    elif name == "decode":  # one query per row against a static cache of 50 slots
        q, k, v, go = _tensors(b, hq, hkv, 1, 50, d, seed=2 * hq + hkv)
        kl = [7, 33, 50]
        for i, n in enumerate(kl):  # slots past kv_len hold junk (a stale or unwritten cache)
            k[i, :, n:], v[i, :, n:] = float("nan"), float("inf")
        qs, mask, causal = [n - 1 for n in kl], None, True
    elif name == "rollout_mask":  # the rollout's step: a boolean mask over the whole cache
        q, k, v, go = _tensors(b, hq, hkv, 3, 40, d, seed=3 * hq + hkv)
        lens = torch.tensor([3, 17, 40])
        pos = (lens - 3)[:, None] + torch.arange(3)[None, :]  # the last three positions
        j = torch.arange(40)
        mask = ((j[None, None, :] <= pos[:, :, None]) & (j < lens[:, None, None]))[:, None]
        k[0, :, 3:], v[0, :, 3:] = 1e3, -1e3  # finite junk the mask hides
        qs, kl, causal = [0, 0, 0], [40, 40, 40], False
    else:
        raise AssertionError(name)
    pos_t = torch.tensor(qs)
    len_t = torch.tensor(kl)
    out = [t.to(DEV) for t in (q, k, v, go, pos_t, len_t)]
    return (*out, mask.to(DEV) if mask is not None else None, causal)


CASES = ["causal_ragged", "decode", "rollout_mask"]


@pytest.mark.parametrize("hq,hkv", GROUPINGS)
@pytest.mark.parametrize("name", CASES)
def test_forward_equals_repeat_then_attend(name, hq, hkv):
    q, k, v, _, qs, kl, mask, causal = _case(name, hq, hkv)
    g = hq // hkv
    got = OP(q, k, v, qs, kl, mask, causal, 0.2)
    want = OP(q, _repeat(k, g), _repeat(v, g), qs, kl, mask, causal, 0.2)
    assert_bitwise_equal(got[0], want[0], f"{name} out, Hq={hq} Hkv={hkv}")
    assert_bitwise_equal(got[1], want[1], f"{name} lse, Hq={hq} Hkv={hkv}")


def _grads(q, k, v, go, qs, kl, mask, causal, *, repeat: int):
    """(dq, dk, dv) of the op; repeat > 0: of the old lowering (k, v repeated in k's dtype,
    cast to q's dtype, attended, the per-head grads summed by `_group_sum`)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    a, kk, vv = leaves
    if repeat:
        kk, vv = (_repeat(t, repeat).detach().to(q.dtype).requires_grad_() for t in (kk, vv))
    out, _ = OP(a, kk, vv, qs, kl, mask, causal, 0.2)
    out.backward(go)
    if repeat:
        return a.grad, _group_sum(kk.grad, repeat, k.dtype), _group_sum(vv.grad, repeat, v.dtype)
    return tuple(t.grad for t in leaves)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("hq,hkv", GROUPINGS)
@pytest.mark.parametrize("name", ["causal_ragged", "rollout_mask"])
def test_gradients_equal_repeat_then_attend(name, hq, hkv, kv_dtype):
    """The learner's backward keeps its bits: per-query-head dK / dV, each rounded to BF16,
    then the group's FP32 sum in order, rounded once to k's dtype (FP32 k: no second rounding,
    as when the repeat and its sum ran in FP32 before the cast to BF16)."""
    q, k, v, go, qs, kl, mask, causal = _case(name, hq, hkv)
    k, v = k.to(kv_dtype), v.to(kv_dtype)
    got = _grads(q, k, v, go, qs, kl, mask, causal, repeat=0)
    want = _grads(q, k, v, go, qs, kl, mask, causal, repeat=hq // hkv)
    for n, a, b in zip("qkv", got, want):
        assert a.dtype == (q.dtype if n == "q" else kv_dtype)
        assert_bitwise_equal(a, b, f"{name} d{n}, Hq={hq} Hkv={hkv}")


def test_fp32_kv_forward_equals_bf16_kv():
    """FP32 k, v are rounded to q's dtype inside the op: the forward of the BF16 values."""
    q, k, v, _, qs, kl, mask, causal = _case("causal_ragged", 4, 2)
    got = OP(q, k.float(), v.float(), qs, kl, mask, causal, 0.2)
    want = OP(q, k, v, qs, kl, mask, causal, 0.2)
    assert_bitwise_equal(got[0], want[0], "out")
    torch.library.opcheck(OP, (q, k.float().requires_grad_(), v.float(), qs, kl, mask, causal, 0.2))


# ------------------------------------------------------------------------ the Triton kernels
needs_kernels = pytest.mark.skipif(
    not torch.cuda.is_available() and not interpreting(), reason="needs CUDA or the interpreter"
)


@needs_kernels
@pytest.mark.parametrize("hq,hkv", [(4, 2), (6, 3), (8, 1)])
@pytest.mark.parametrize("name", CASES)
def test_kernel_forward_equals_repeat_then_attend(name, hq, hkv):
    """The forward kernel's rows hold a whole group (row = query * G + head): the same bits as
    one head per program on repeated k, v; a decode row visits only its own key blocks (the
    junk past kv_len is never read into a result)."""
    from fp4_compile.codegen.invariant import attention_kernel as ik

    q, k, v, _, qs, kl, mask, causal = _case(name, hq, hkv, d=16)
    g = hq // hkv
    got = ik.attention(q, k, v, qs, kl, mask, causal, 0.2)
    want = ik.attention(q, _repeat(k, g), _repeat(v, g), qs, kl, mask, causal, 0.2)
    assert_bitwise_equal(got[0], want[0], f"{name} out, Hq={hq} Hkv={hkv}")
    assert_bitwise_equal(got[1], want[1], f"{name} lse, Hq={hq} Hkv={hkv}")
    assert bool(torch.isfinite(got[0]).all())


@needs_kernels
@pytest.mark.parametrize("hq,hkv", [(4, 2), (6, 3)])
@pytest.mark.parametrize("name", ["causal_ragged", "rollout_mask"])
def test_kernel_backward_equals_repeat_then_attend(name, hq, hkv):
    """The backward launches read the KV head of each query head in place and sum the group
    after: the per-head kernels on repeated k, v followed by the ordered group sum, bitwise."""
    from fp4_compile.codegen.invariant import attention_kernel as ik
    from fp4_compile.codegen.invariant.attention_backward_kernel import attention_backward

    q, k, v, go, qs, kl, mask, causal = _case(name, hq, hkv, d=16)
    g = hq // hkv
    out, lse = ik.attention(q, k, v, qs, kl, mask, causal, 0.2)
    got = attention_backward(go, q, k, v, out, lse, qs, kl, mask, causal, 0.2)
    kr, vr = _repeat(k, g).contiguous(), _repeat(v, g).contiguous()
    dq, dk_h, dv_h = attention_backward(go, q, kr, vr, out, lse, qs, kl, mask, causal, 0.2)
    want = (dq, _group_sum(dk_h, g, k.dtype), _group_sum(dv_h, g, v.dtype))
    for n, a, b in zip("qkv", got, want):
        assert_bitwise_equal(a, b, f"{name} d{n}, Hq={hq} Hkv={hkv}")
