"""`fp4_compile::routing_order` on the GPU (the compiled Triton kernel) == `invariant_routing`
followed by `expert_order` on the same CUDA tensors, every output bitwise: Qwen3-30B-A3B's
routing (128 experts, top 8, renormalized; BF16 router logits, BF16 sorted weights) from 1 token
to the 4096-slot limit of one launch and past it (the two ops), the tiny configurations, ties.
The shared per-row routing code (`routing_kernel.route_rows`) run on [1, E] tiles by the
routing kernel and on [block_t, E] tiles here must give the same bits: this is where that is
checked on the hardware."""

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
ops = torch.ops.fp4_compile


def _two_ops(logits, k, norm, values_dtype):
    weights, experts = ops.invariant_routing(logits, k, norm)
    return ops.expert_order(experts, weights, logits.shape[-1], values_dtype)


@pytest.mark.parametrize("tokens", [1, 7, 64, 200, 512, 513, 2048])
@pytest.mark.parametrize("norm", [True, False])
def test_routing_order_equals_the_two_ops(tokens, norm):
    g = torch.Generator(device=DEVICE).manual_seed(tokens)
    logits = (torch.randn(tokens, 128, generator=g, device=DEVICE) * 2).bfloat16()
    logits[0, :] = 0.5  # a row of ties
    if tokens > 2:
        logits[2, 5] = logits[2, 9] = logits[2].max() + 1  # a tie at the top
    for values_dtype in (torch.bfloat16, torch.float32):
        got = ops.routing_order(logits, 8, norm, values_dtype)
        want = _two_ops(logits, 8, norm, values_dtype)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_bitwise_equal(a, b, f"output {i} at {tokens} tokens, {values_dtype}")


@pytest.mark.parametrize(("k", "e"), [(2, 4), (3, 10), (1, 2), (8, 256)])
@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_routing_order_small_configs(k, e, tokens):
    g = torch.Generator(device=DEVICE).manual_seed(tokens * e)
    logits = (torch.randint(-4, 5, (tokens, e), generator=g, device=DEVICE) / 2).float()
    for norm in (True, False):
        got = ops.routing_order(logits, k, norm, torch.bfloat16)
        want = _two_ops(logits, k, norm, torch.bfloat16)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_bitwise_equal(a, b, f"output {i}, top-{k} of {e}, {tokens} tokens")
