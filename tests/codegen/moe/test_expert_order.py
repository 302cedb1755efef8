"""`fp4_compile::expert_order` (the routing's sort, counts, offsets, inverse and sorted weights as
one op) == transformers' grouped experts' own torch ops, bitwise: the CPU implementation against
them (forward, and the routing weights' gradient through the cast and the gather), and the Triton
kernel (the interpreter here, CUDA on the GPU) against the CPU implementation, across chunk
sizes, with ties, unused experts and signed zeros."""

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen.moe.reference import expert_order_reference
from fp4_compile.testing import assert_autograd_bitwise_equal, assert_bitwise_equal

ops = torch.ops.fp4_compile


def _case(t=7, k=3, e=10, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    experts = torch.randint(0, e, (t, k), generator=g)
    experts[:, 0] = 2  # many ties on one expert
    values = torch.rand(t, k, generator=g).to(dtype)
    values[0, 1] = -0.0
    return experts, values


def _transformers_ops(experts, values, num_experts, values_dtype):
    """transformers 5's `grouped_mm_experts_forward` bookkeeping (CPU spelling)."""
    k = experts.shape[-1]
    sample_weights = values.to(values_dtype).reshape(-1)
    expert_ids_g, perm = torch.sort(experts.reshape(-1), stable=True)
    tokens_per_expert = torch.histc(
        expert_ids_g.float(), bins=num_experts, min=0, max=num_experts - 1
    )
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.shape[0])
    return sample_weights[perm], perm, offsets, inverse, perm // k


@pytest.mark.parametrize("values_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_op_equals_transformers_ops(values_dtype):
    """Every output, and the values' gradient, == the torch ops it replaces, bitwise."""
    experts, values = _case()
    got = ops.expert_order(experts, values, 10, values_dtype)
    want = _transformers_ops(experts, values, 10, values_dtype)
    names = ("sorted_values", "perm", "offsets", "inverse", "token_index")
    for name, a, b in zip(names, got, want):
        assert_bitwise_equal(a, b, name)
    assert_autograd_bitwise_equal(
        lambda v: ops.expert_order(experts, v, 10, values_dtype)[0],
        lambda v: _transformers_ops(experts, v, 10, values_dtype)[0],
        (values,),
        "sorted values",
    )


def test_ids_out_of_range_raise():
    experts, values = _case()
    experts[1, 1] = 10
    with pytest.raises(ValueError, match="expert ids"):
        ops.expert_order(experts, values, 10, torch.float32)


def test_opcheck():
    experts, values = _case()
    torch.library.opcheck(
        ops.expert_order.default, (experts, values.requires_grad_(), 10, torch.bfloat16)
    )


@pytest.mark.parametrize(
    ("t", "k", "e", "dtype"),
    [(1, 8, 128, torch.float32), (7, 3, 10, torch.bfloat16), (13, 2, 5, torch.float32)],
)
def test_kernel_equals_reference(t, k, e, dtype):
    """The Triton kernel (interpreter on CPU: chunks of 8 slots, so several chunks and a ragged
    last one) == the CPU reference, every output bitwise, BF16 and FP32 weights."""
    pytest.importorskip("triton")
    from fp4_compile.codegen.moe.expert_order_kernel import expert_order_triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    experts, values = _case(t, k, e, seed=t, dtype=dtype)
    values = values * 1.001  # bits below bf16's: the cast rounds
    for values_dtype in (torch.bfloat16, torch.float32):
        got = expert_order_triton(experts.to(dev), values.to(dev), e, values_dtype)
        want = expert_order_reference(experts, values, e, values_dtype)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_bitwise_equal(a.cpu(), b, f"output {i}, {values_dtype}")
