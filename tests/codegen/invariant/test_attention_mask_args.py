"""`fp4_compile::invariant_attention_mask_args`: a mask's kernel arguments made once per graph.

Contracts (bitwise; integers and the attention's own bits): the op's CPU path
(`reference.attention_mask_args`) equals its kernel (`attention_masks.prepare_mask`, compiled on
CUDA, else in the Triton interpreter) byte for byte, on interval and non-interval masks,
broadcast dims and ragged key counts; the attention kernels given the op's tensors give the bits
they give when they prepare the mask themselves, forward and backward; the op and the attention
ops with the trailing arguments pass `torch.library.opcheck`; mismatched arguments are refused.
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.invariant import reference as cpu
from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
B, HQ, HKV, T, D = 2, 4, 2, 40, 16
OP = torch.ops.fp4_compile.invariant_attention_mask_args
needs_kernels = pytest.mark.skipif(
    not torch.cuda.is_available() and not interpreting(), reason="needs CUDA or the interpreter"
)


def _causal_padded(left: int = 0, right: int = 0):
    """[B, 1, T, T] causal; sequence 1 padded on its first `left` and last `right` keys."""
    tril = torch.ones(T, T, dtype=torch.bool).tril()
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[1, :left] = False
    keep[1, T - right :] = False
    return (tril[None] & keep[:, None, :])[:, None]


def _random(shape, seed=0, p=0.6):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < p


MASKS = {  # (mask, tq, tk)
    "causal padded": (_causal_padded(right=9), T, T),
    "left padded": (_causal_padded(left=21), T, T),
    "random": (_random((B, 1, T, T)), T, T),
    "per head, 33 keys": (_random((1, HQ, 3, 33), 1), 3, 33),
    "broadcast queries": (_random((B, 1, 1, 70), 2), 5, 70),
    "2D": (torch.ones(T, T, dtype=torch.bool).tril(), T, T),
    "no key visible": (torch.zeros(B, 1, 4, 64, dtype=torch.bool), 4, 64),
    "no keys": (torch.zeros(B, 1, 4, 0, dtype=torch.bool), 4, 0),
}


@needs_kernels
@pytest.mark.parametrize("name", MASKS)
def test_reference_equals_kernel_bitwise(name):
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant.attention_masks import prepare_mask

    mask, tq, tk = MASKS[name]
    want = cpu.attention_mask_args(mask, tq, tk)
    got = prepare_mask(mask.to(DEV), tq, tk)
    for g, w, part in zip(got, want, ("words", "intervals", "flag")):
        assert g.dtype == w.dtype == torch.int32 and g.shape == w.shape, (part, g.shape, w.shape)
        assert_bitwise_equal(g.cpu(), w, f"{name}: {part}, kernel vs reference")


def test_reference_layout():
    """Words, intervals and flag of a known mask (the layout the kernels read)."""
    words, iv, flag = cpu.attention_mask_args(_causal_padded(right=9), T, T)
    assert words.shape == (B * T, 2) and int(flag) == 1
    assert words[5].tolist() == [0b111111, 0]  # sequence 0, query 5: keys 0..5
    assert words[39].tolist() == [-1, 0xFF]  # sequence 0, query 39: keys 0..39
    assert words[T + 39].tolist() == [2**31 - 1, 0]  # sequence 1, query 39: keys 0..30
    assert iv[T + 35].tolist() == [0, T - 9] and iv[5].tolist() == [0, 6]
    holes = _causal_padded()
    holes[0, 0, 20, 3] = False  # keys 0-2 and 4-20: not one interval
    assert int(cpu.attention_mask_args(holes, T, T)[2]) == 0
    _, iv0, flag0 = cpu.attention_mask_args(*MASKS["no key visible"])
    assert iv0[0].tolist() == [64, 0] and int(flag0) == 1  # an empty interval: [tk, 0)


@pytest.mark.parametrize("name", ["causal padded", "broadcast queries", "no keys"])
def test_opcheck(name):
    mask, tq, tk = MASKS[name]
    torch.library.opcheck(OP, (mask, tq, tk))


def test_attention_opcheck_with_the_trailing_arguments():
    """invariant_attention with the op's three tensors: schema, fake, autograd (saved for the
    backward op) and the CPU path (which reads the mask, so the bits of no trailing arguments)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, HQ, T, D, generator=g).bfloat16().requires_grad_()
    k, v = (torch.randn(B, HKV, T, D, generator=g).bfloat16() for _ in range(2))
    mask = _causal_padded(right=9)
    lengths = (torch.zeros(B, dtype=torch.int64), torch.full((B,), T))
    args = (q, k, v, *lengths, mask, False, 0.25, *OP(mask, T, T))
    torch.library.opcheck(torch.ops.fp4_compile.invariant_attention, args)
    with_args = torch.ops.fp4_compile.invariant_attention(*args)
    without = torch.ops.fp4_compile.invariant_attention(*args[:8])
    for a, b, part in zip(with_args, without, ("out", "lse")):
        assert_bitwise_equal(a, b, f"CPU {part}: with vs without the trailing arguments")
    with pytest.raises(ValueError, match="all three or none"):
        torch.ops.fp4_compile.invariant_attention(*args[:9])


@needs_kernels
@pytest.mark.parametrize("name", ["causal padded", "left padded", "random"])
def test_kernels_with_prepared_arguments_bitwise(name):
    """The launchers given the op's tensors == the launchers preparing the mask, forward and
    backward (interval path and bit path)."""
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant import attention_backward_kernel as ab
    from fp4_compile.codegen.invariant import attention_kernel as ik

    g = torch.Generator().manual_seed(5)
    q, go = (torch.randn(B, HQ, T, D, generator=g).bfloat16().to(DEV) for _ in range(2))
    k, v = (torch.randn(B, HKV, T, D, generator=g).bfloat16().to(DEV) for _ in range(2))
    qs, kl = torch.zeros(B, dtype=torch.int64, device=DEV), torch.full((B,), T, device=DEV)
    mask = MASKS[name][0].to(DEV)
    prepared = tuple(t.to(DEV) for t in cpu.attention_mask_args(mask.cpu(), T, T))

    def run(p):
        out, lse = ik.attention(q, k, v, qs, kl, mask, False, 0.25, prepared=p)
        grads = ab.attention_backward(go, q, k, v, out, lse, qs, kl, mask, False, 0.25, prepared=p)
        return (out, lse, *grads)

    for got, want, part in zip(run(prepared), run(None), ("out", "lse", "dq", "dk", "dv")):
        assert_bitwise_equal(got, want, f"{name}: {part}, prepared vs inside the call")


@needs_kernels
def test_mismatched_prepared_arguments_are_refused():
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant.attention_masks import mask_args

    mask = _causal_padded()
    words, iv, flag = cpu.attention_mask_args(mask, T, T)
    with pytest.raises(ValueError, match="do not fit mask"):
        mask_args(mask, B, HQ, T, T, (words[:-1], iv, flag))
    with pytest.raises(ValueError, match="do not fit mask"):
        mask_args(mask, B, HQ, T, T, (words, iv.long(), flag))
