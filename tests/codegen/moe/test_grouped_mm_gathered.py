"""`fp4_compile::invariant_grouped_mm` with `x_index` (the bf16 recipe's MoE experts reading
their tokens' rows in the operand load: `passes/fold_expert_gathers.py`) == the same op on
`gather_rows(x, x_index)`; and its unit global scales are made once per device, not per call.

Tier: bitwise, raw bytes: the forward on the CPU reference, the kernel in the Triton
interpreter (CPU, no GPU) and the compiled kernel (`gpu` marker, Qwen3-30B-A3B's expert
shapes); the backward (dX of the ungathered rows, position-ordered sums of the gathered rows'
dX, and dW) equal to autograd through the unfolded ops. The index repeats rows (top-k) and
leaves some unread, and an expert has no rows.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile


def _case(tokens, top_k, experts, k, n, *, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(tokens, k, generator=g, device=device).bfloat16()
    w = (torch.randn(experts, n, k, generator=g, device=device) / k**0.5).bfloat16()
    ids = torch.randint(
        0, experts - 1, (tokens * top_k,), generator=g, device=device
    )  # last: empty
    perm = torch.sort(ids, stable=True).indices
    counts = torch.bincount(ids, minlength=experts)
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    return h, w, offsets, perm // top_k


@pytest.mark.parametrize("tokens", [1, 5])
def test_reference_forward_and_backward_equal_the_gather(tokens):
    h, w, offsets, idx = _case(tokens, 3, 5, 32, 24)
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    folded = ops.invariant_grouped_mm(h1, w1, offsets, torch.bfloat16, idx)
    plain = ops.invariant_grouped_mm(ops.gather_rows(h2, idx), w2, offsets, torch.bfloat16)
    assert_bitwise_equal(folded, plain, "forward")
    grad = torch.randn(folded.shape, generator=torch.Generator().manual_seed(3)).bfloat16()
    folded.backward(grad)
    plain.backward(grad)
    assert_bitwise_equal(h1.grad, h2.grad, "dX")
    assert_bitwise_equal(w1.grad, w2.grad, "dW")


def test_opcheck_with_index():
    h, w, offsets, idx = _case(4, 2, 3, 16, 16)
    torch.library.opcheck(ops.invariant_grouped_mm.default, (h, w, offsets, torch.bfloat16, idx))


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
@pytest.mark.parametrize("tokens", [1, 7])
def test_kernel_gathered_equals_gather_then_kernel_interpreter(tokens):
    pytest.importorskip("triton")
    from fp4_compile.codegen.moe.grouped_mm import grouped_kernel

    h, w, offsets, idx = _case(tokens, 2, 4, 64, 48)
    folded = grouped_kernel(h, w, offsets, torch.bfloat16, x_index=idx)
    plain = grouped_kernel(h[idx].contiguous(), w, offsets, torch.bfloat16)
    assert_bitwise_equal(folded, plain, f"{tokens} tokens")


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
def test_unit_scale_made_once_not_per_call():
    """After the first call on a device, a call launches no fill for its global scales."""
    pytest.importorskip("triton")
    from fp4_compile.codegen.moe import grouped_mm

    h, w, offsets, idx = _case(3, 2, 4, 64, 48)
    first = grouped_mm.grouped_kernel(h, w, offsets, torch.bfloat16, x_index=idx)
    one = grouped_mm.unit_scale(h.device)
    assert one is grouped_mm.unit_scale(h.device) and one.tolist() == [1.0]
    with mock.patch.object(torch, "ones", side_effect=AssertionError("a ones fill per call")):
        again = grouped_mm.grouped_kernel(h, w, offsets, torch.bfloat16, x_index=idx)
    assert_bitwise_equal(again, first, "the second call")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, 512])
def test_kernel_gathered_equals_gather_then_kernel_gpu(tokens):
    """Qwen3-30B-A3B's experts (128, top 8): gate_up [1536, 2048] and down [2048, 768]."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    for n, k in ((1536, 2048), (2048, 768)):
        h, w, offsets, idx = _case(tokens, 8, 128, k, n, device="cuda")
        folded = ops.invariant_grouped_mm(h, w, offsets, torch.bfloat16, idx)
        plain = ops.invariant_grouped_mm(ops.gather_rows(h, idx), w, offsets, torch.bfloat16)
        assert_bitwise_equal(folded, plain, f"{tokens} tokens, [{n}, {k}]")
