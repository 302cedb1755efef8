"""Mask tensors in the Triton attention kernels (`attention_masks.mask_args`): compiled on
CUDA, else in the Triton interpreter.

Contracts: `mask_args` finds each row's [lo, hi) and flags exactly the masks whose rows are
intervals; for an interval mask the interval path (bounds, skipped key and row blocks, leading
ones too) gives the bits of the byte path, forward and backward; a causal mask tensor gives the bits of is_causal;
a mask that is not intervals (random) stays within the reference's budget.
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
B, HQ, HKV, T, D = 2, 4, 2, 40, 16


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant import attention_backward_kernel as attention_backward
    from fp4_compile.codegen.invariant import attention_kernel as invariant_kernels

    return invariant_kernels, attention_backward


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, go = (torch.randn(B, HQ, T, D, generator=g).bfloat16().to(DEV) for _ in range(2))
    k, v = (torch.randn(B, HKV, T, D, generator=g).bfloat16().to(DEV) for _ in range(2))
    zeros = torch.zeros(B, dtype=torch.int64, device=DEV)
    return q, k, v, go, zeros, torch.full((B,), T, device=DEV)


def _causal_padded():
    """Causal, sequence 1 padded on its last 9 keys: every row an interval."""
    tril = torch.ones(T, T, dtype=torch.bool, device=DEV).tril()
    keep = torch.ones(B, T, dtype=torch.bool, device=DEV)
    keep[1, T - 9 :] = False
    return (tril[None] & keep[:, None, :])[:, None]  # [B, 1, T, T]


def test_mask_args_intervals_and_flag(kernels):
    ik, _ = kernels
    mask = _causal_padded()
    words, (smb, smh), iv, ok = ik.mask_args(mask, B, HQ, T, T)
    assert words.shape == (B * T, 2) and (smb, smh) == (T, 0) and int(ok) == 1
    assert words[5].tolist() == [0b111111, 0]  # row 5 of sequence 0: keys 0..5
    assert words[39].tolist() == [-1, 0xFF]  # sequence 0, query 39: keys 0..39
    assert words[T + 39].tolist() == [2**31 - 1, 0]  # sequence 1, query 39: keys 0..30
    row = 1 * smb + 35  # sequence 1, query 35: keys 0..30 (31.. padded)
    assert iv[row].tolist() == [0, T - 9]
    assert iv[5].tolist() == [0, 6]
    holes = mask.clone()
    holes[0, 0, 20, 3] = False  # row 20 of sequence 0: keys 0-2 and 4-20, not one interval
    assert int(ik.mask_args(holes, B, HQ, T, T)[3]) == 0
    empty = torch.zeros(T, T, dtype=torch.bool, device=DEV)  # no visible key: an empty interval
    _, strides, iv0, ok0 = ik.mask_args(empty, B, HQ, T, T)
    assert strides == (0, 0) and int(ok0) == 1 and bool((iv0[:, 0] >= iv0[:, 1]).all())


def _force_bit_path(monkeypatch, ik):
    real = ik.mask_args

    def bytes_only(*args):
        m8, strides, iv, ok = real(*args)
        return m8, strides, iv, torch.zeros_like(ok)

    monkeypatch.setattr(ik, "mask_args", bytes_only)
    import fp4_compile.codegen.invariant.attention_backward_kernel as ab

    monkeypatch.setattr(ab, "mask_args", bytes_only)


def _forward_backward(ik, ab, mask, causal):
    q, k, v, go, qs, kl = _inputs()
    out, lse = ik.attention(q, k, v, qs, kl, mask, causal, 0.25)
    grads = ab.attention_backward(go, q, k, v, out, lse, qs, kl, mask, causal, 0.25)
    return (out, lse, *grads)


def _assert_interval_path_equals_bit_path(ik, ab, mask, monkeypatch, label):
    fast = _forward_backward(ik, ab, mask, False)
    with monkeypatch.context() as mp:
        _force_bit_path(mp, ik)
        slow = _forward_backward(ik, ab, mask, False)
    for got, want, name in zip(fast, slow, ("out", "lse", "dq", "dk", "dv")):
        assert_bitwise_equal(got, want, f"{name}: {label} interval path vs bit path")


def test_interval_path_equals_byte_path_and_causal(kernels, monkeypatch):
    ik, ab = kernels
    _assert_interval_path_equals_bit_path(ik, ab, _causal_padded(), monkeypatch, "padded")
    causal_tensor = _forward_backward(
        ik, ab, torch.ones(T, T, dtype=torch.bool).tril().to(DEV), False
    )
    causal = _forward_backward(ik, ab, None, True)
    for got, want, name in zip(causal_tensor[:2], causal[:2], ("out", "lse")):
        assert_bitwise_equal(got, want, f"{name}: causal mask tensor vs is_causal")


def test_left_padded_interval_mask_skips_leading_blocks_bitwise(kernels, monkeypatch):
    """Left padding (RL prompts): sequence 1's first 21 keys are padding, so its rows start at
    key 21 (its first rows see no key at all); the forward's interval loop starts at the block
    of the rows' first visible key. Bitwise the bit path, forward and backward."""
    ik, ab = kernels
    tril = torch.ones(T, T, dtype=torch.bool, device=DEV).tril()
    keep = torch.ones(B, T, dtype=torch.bool, device=DEV)
    keep[1, :21] = False
    mask = (tril[None] & keep[:, None, :])[:, None]
    assert int(ik.mask_args(mask, B, HQ, T, T)[3]) == 1
    _assert_interval_path_equals_bit_path(ik, ab, mask, monkeypatch, "left-padded")


def test_non_interval_mask_within_the_reference_budget(kernels):
    ik, ab = kernels
    q, k, v, go, qs, kl = _inputs(1)
    mask = torch.rand(B, 1, T, T, generator=torch.Generator().manual_seed(4)) < 0.6
    mask = mask.to(DEV)
    assert int(ik.mask_args(mask, B, HQ, T, T)[3]) == 0
    out, lse = ik.attention(q, k, v, qs, kl, mask, False, 0.25)
    args = [t.cpu() for t in (q, k, v, qs, kl, mask)]
    ref, ref_lse = cpu.attention(*args, False, 0.25)
    assert (out.cpu().float() - ref.float()).abs().max() <= 2 * 2**-8 * (1 + ref.abs().max())
    assert (lse.cpu() - ref_lse).abs().max() <= 1e-5 * (1 + ref_lse.abs().max())
