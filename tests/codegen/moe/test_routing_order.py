"""`fp4_compile::routing_order` (the router's softmax top-k and the experts' order of its slots as
one op) == `invariant_routing` followed by `expert_order`, bitwise: the CPU implementation against
the two CPU ops, and the one-launch Triton kernel (the interpreter here, CUDA in tests/gpu) against
the two ops' kernels; several token counts (ragged last row block), ties in the logits, top-8 of
128 experts and tiny configurations, normalized or not, BF16 and FP32 sorted weights."""

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
NAMES = ("sorted_values", "perm", "offsets", "inverse", "token_index")
CONFIGS = [(8, 128), (2, 4), (3, 10), (1, 2)]  # (top_k, experts)


def _logits(t, e, seed=0, dtype=torch.bfloat16):
    """[T, E] logits with ties: row 0 all equal, every third row a repeated top value, and few
    distinct values (BF16 of small integers and halves) so equal probabilities are common."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randint(-6, 7, (t, e), generator=g).float() / 2).to(dtype)
    x[0] = 1.0
    if e > 3:
        x[2::3, 1] = 4.0
        x[2::3, e - 1] = 4.0
    return x


def _two_ops(logits, k, norm, values_dtype):
    weights, experts = ops.invariant_routing(logits, k, norm)
    return ops.expert_order(experts, weights, logits.shape[-1], values_dtype)


def _assert_same(got, want, what):
    assert len(got) == len(want) == 5
    for name, a, b in zip(NAMES, got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name, a.dtype, b.dtype)
        assert_bitwise_equal(a.cpu(), b.cpu(), f"{what}: {name}")


@pytest.mark.parametrize(("k", "e"), CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("t", [1, 3, 17, 64])
def test_op_equals_the_two_ops(k, e, t):
    """CPU: every output == expert_order(invariant_routing(logits)), both norm settings, BF16
    and FP32 weights, FP32 and BF16 logits."""
    for dtype in (torch.bfloat16, torch.float32):
        logits = _logits(t, e, seed=t + e, dtype=dtype)
        for norm in (True, False):
            for values_dtype in (torch.bfloat16, torch.float32):
                got = ops.routing_order(logits, k, norm, values_dtype)
                want = _two_ops(logits, k, norm, values_dtype)
                _assert_same(got, want, f"T={t} k={k} E={e} norm={norm} {values_dtype}")


def test_ties_take_the_lower_expert():
    """Equal logits: the lower expert first (the routing's stable top-k), then its slots in the
    experts' order."""
    logits = torch.zeros(2, 4)
    sorted_values, perm, offsets, _, token = ops.routing_order(logits, 2, False, torch.float32)
    assert perm.tolist() == [0, 2, 1, 3]  # slots (token, j): experts 0, 1 for both tokens
    assert offsets.tolist() == [2, 4, 4, 4]
    assert token.tolist() == [0, 1, 0, 1]
    assert sorted_values.tolist() == [0.25] * 4


def test_checks_and_opcheck():
    with pytest.raises(ValueError, match="top_k"):
        ops.routing_order(torch.zeros(2, 4), 5, False, torch.float32)
    with pytest.raises(ValueError, match="logits"):
        ops.routing_order(torch.zeros(2, 4, 1), 1, False, torch.float32)
    torch.library.opcheck(ops.routing_order.default, (_logits(5, 10), 3, True, torch.bfloat16))


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
@pytest.mark.parametrize(("k", "e"), CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("t", [1, 5, 13])
def test_kernel_equals_the_two_kernels(k, e, t):
    """The one-launch kernel (interpreter: 4 rows per routing step, 8 slots per order step, so
    ragged last blocks) == the routing kernel then the expert_order kernel, every output
    bitwise, BF16 logits with ties, both norm settings, BF16 and FP32 weights."""
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant.routing_kernel import routing
    from fp4_compile.codegen.moe.expert_order_kernel import expert_order_triton
    from fp4_compile.codegen.moe.routing_order_kernel import routing_order_triton

    logits = _logits(t, e, seed=3 * t + e)
    for norm in (True, False):
        for values_dtype in (torch.bfloat16, torch.float32):
            got = routing_order_triton(logits, k, norm, values_dtype)
            weights, experts = routing(logits, k, norm)
            want = expert_order_triton(experts, weights, e, values_dtype)
            _assert_same(got, want, f"T={t} k={k} E={e} norm={norm} {values_dtype}")


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
def test_kernel_refuses_past_expert_order_limits():
    """Past expert_order's one-program limits (slots, experts) the kernel raises: the op's
    dispatch runs the two ops there."""
    pytest.importorskip("triton")
    from fp4_compile.codegen.moe.routing_order_kernel import routing_order_triton

    with pytest.raises(ValueError, match="past its limits"):
        routing_order_triton(torch.zeros(513, 128), 8, True, torch.bfloat16)  # 4104 slots
    with pytest.raises(ValueError, match="past its limits"):
        routing_order_triton(torch.zeros(2, 300), 2, True, torch.bfloat16)  # 300 experts
