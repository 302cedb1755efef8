"""`fp4_compile::embedding`: the lookup equals stock F.embedding; its one-op backward is the
position-ordered FP32 sum per id (`gather_rows_backward`'s definition, on every device)."""

import pytest
import torch
import torch.nn.functional as F

from fp4_compile.codegen.invariant import embedding as emb
from fp4_compile.testing import assert_bitwise_equal


def _ordered_sums(gy, ids, rows, padding):
    """Row r: the FP32 sum of gy's rows with id r in position order, rounded once."""
    acc = torch.zeros(rows, gy.shape[-1], dtype=torch.float32)
    for p, r in enumerate(ids.reshape(-1).tolist()):
        if r != padding:
            acc[r] = acc[r] + gy.reshape(-1, gy.shape[-1])[p].float()
    return acc.to(gy.dtype)


def test_embedding_forward_equals_stock_backward_is_ordered_sums():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, 16, generator=g).bfloat16().requires_grad_()
    ids = torch.tensor([[3, 7, 3, 0], [7, 7, 2, 3]])
    gy = torch.randn(2, 4, 16, generator=g).bfloat16()
    for padding in (-1, 7):
        w.grad = None
        y = torch.ops.fp4_compile.embedding(w, ids, padding)
        y.backward(gy)
        ours = w.grad.clone()
        w.grad = None
        ref = F.embedding(ids, w, padding_idx=padding if padding >= 0 else None)
        ref.backward(gy)
        assert_bitwise_equal(y, ref, "forward")
        assert ours.shape == w.shape and ours.dtype == w.dtype
        assert_bitwise_equal(ours, _ordered_sums(gy, ids, 50, padding), f"padding_idx={padding}")
        once = torch.tensor([0, 2])  # ids named once: a single term, stock's bits too
        assert_bitwise_equal(ours[once], w.grad[once], "ids seen once equal stock")
        if padding >= 0:
            assert not ours[padding].any()


def test_embedding_opcheck_and_errors():
    w = torch.randn(10, 8, requires_grad=True)
    torch.library.opcheck(emb.embedding, (w, torch.tensor([1, 2, 1]), -1))
    with pytest.raises(TypeError, match="ids"):
        emb.embedding(w, torch.tensor([1.0]), -1)
    with pytest.raises(TypeError, match="weight"):
        emb.embedding(torch.zeros(3, dtype=torch.int64), torch.tensor([1]), -1)
