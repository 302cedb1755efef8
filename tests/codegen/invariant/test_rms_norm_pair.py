"""fp4_compile::invariant_rms_norm_pair (an attention's q and k norms in one launch).

Tiers: bitwise (the op == two invariant_rms_norm calls: outputs, and the gradients of a, b and
both weights; the Triton kernel in the interpreter == the one-norm kernel on each input, with
and without weights, a and b of different row counts, rows of different magnitudes);
integration (opcheck); bad input names the argument.
"""

import pytest
import torch

from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile


def _x(*shape, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def _qk(dtype, hdim=128):
    """q [B, T, 4, D], k [B, T, 2, D] (grouped-query heads), rows of very different size."""
    q = (_x(2, 3, 4, hdim, seed=1) * torch.logspace(-3, 3, 4)[:, None]).to(dtype)
    k = (_x(2, 3, 2, hdim, seed=2) * torch.logspace(-2, 2, 2)[:, None]).to(dtype)
    wq, wk = ((1.0 + 0.1 * _x(hdim, seed=s)).to(dtype) for s in (3, 4))
    return q, k, wq, wk


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weighted", [True, False])
def test_pair_equals_two_norms_bitwise(dtype, weighted):
    """Outputs and every gradient == two invariant_rms_norm calls, bit for bit (CPU op)."""
    q, k, wq, wk = (t.requires_grad_() for t in _qk(dtype))
    wq_, wk_ = (wq, wk) if weighted else (None, None)
    got = ops.invariant_rms_norm_pair(q, wq_, k, wk_, 1e-6)
    want = (ops.invariant_rms_norm(q, wq_, 1e-6), ops.invariant_rms_norm(k, wk_, 1e-6))
    for a, b, what in zip(got, want, ("q", "k")):
        assert_bitwise_equal(a, b, what)
    gq, gk = _x(*q.shape, seed=5).to(dtype), _x(*k.shape, seed=6).to(dtype)
    inputs = (q, k, wq, wk) if weighted else (q, k)
    g_got = torch.autograd.grad((got[0] * gq).sum() + (got[1] * gk).sum(), inputs)
    g_want = torch.autograd.grad((want[0] * gq).sum() + (want[1] * gk).sum(), inputs)
    for a, b, what in zip(g_got, g_want, ("dq", "dk", "dwq", "dwk")):
        assert_bitwise_equal(a, b, what)


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("hdim", [128, 96])
def test_pair_kernel_equals_one_norm_kernel_interpreter(weighted, hdim):
    """Bitwise (interpreter): the pair kernel == the one-norm kernel on q and on k (12 and 2
    rows: programs of ROWS rows, the last one partly masked), H a power of two or not."""
    from fp4_compile.codegen.invariant.rms_norm_kernel import rms_norm, rms_norm_pair

    q, k, wq, wk = (t.float() for t in _qk(torch.float32, hdim))
    k = k[:1, :1]
    wq_, wk_ = (wq, wk) if weighted else (None, None)
    yq, yk = rms_norm_pair(q, wq_, k, wk_, 1e-6)
    assert_bitwise_equal(yq, rms_norm(q, wq_, None, 1e-6)[0], "q")
    assert_bitwise_equal(yk, rms_norm(k, wk_, None, 1e-6)[0], "k")


def test_opcheck():
    """torch.library.opcheck: schema, fake tensors, autograd registration, aot dispatch."""
    q, k, wq, wk = (t.requires_grad_() for t in _qk(torch.float32, 32))
    torch.library.opcheck(ops.invariant_rms_norm_pair.default, (q, wq, k, wk, 1e-6))
    torch.library.opcheck(ops.invariant_rms_norm_pair.default, (q, None, k, None, 1e-6))


def test_bad_input_names_the_argument():
    q, k, wq, wk = _qk(torch.float32, 32)
    with pytest.raises(ValueError, match="row length"):
        ops.invariant_rms_norm_pair(q, wq, k[..., :16], wk[:16], 1e-6)
    with pytest.raises(ValueError, match="b_weight"):
        ops.invariant_rms_norm_pair(q, wq, k, None, 1e-6)
