"""`fp4_compile::embedding`: the lookup and its one-op backward equal stock F.embedding."""

import pytest
import torch
import torch.nn.functional as F

from fp4_compile.codegen import embedding as emb
from fp4_compile.testing import assert_bitwise_equal


def test_embedding_forward_and_backward_equal_stock():
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
        assert_bitwise_equal(ours, w.grad, f"weight grad, padding_idx={padding}")
        if padding >= 0:
            assert not ours[padding].any()


def test_embedding_opcheck_and_errors():
    w = torch.randn(10, 8, requires_grad=True)
    torch.library.opcheck(emb.embedding, (w, torch.tensor([1, 2, 1]), -1))
    with pytest.raises(TypeError, match="ids"):
        emb.embedding(w, torch.tensor([1.0]), -1)
    with pytest.raises(TypeError, match="weight"):
        emb.embedding(torch.zeros(3, dtype=torch.int64), torch.tensor([1]), -1)
