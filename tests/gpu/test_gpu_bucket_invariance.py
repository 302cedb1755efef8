"""Pinned GEMM configs under cancellation: every pinned M bucket gives the same bits.

Random-normal data hides accumulation-order differences; these rows are cancellation-heavy
(magnitudes 1e-4..1e2 across K, shuffled), at K in {32, 256, 2048}. Bitwise: row i of op(x[:m])
== row i of op(x) for every m in MS (NVFP4 linear with packed and with on-grid weights, the BF16
invariant linear), and a grouped MoE GEMM (whose bucket follows the tokens per expert) == each
expert's rows alone. The batch invariance that learner == rollout rests on.
"""

import gpu_internals as gi
import pytest
import torch

from fp4_compile import NVFP4Recipe, quantize, quantize_experts
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
MS = (1, 7, 16, 17, 63, 64, 65, 129, 257)
KS = (32, 256, 2048)
N, NUM_EXPERTS, EXPERT_N = 256, 8, 128


def _x(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-4, 2, shape[-1])
    return x[..., torch.randperm(shape[-1], generator=g)].to(torch.bfloat16).to(DEVICE)


def _assert_rows_equal_in_every_bucket(op, x):
    full = op(x)
    for m in MS:
        assert_bitwise_equal(op(x[:m]), full[:m], f"rows of op(x[:{m}]) vs op(x)")


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("weights", ["packed", "on-grid"])
def test_nvfp4_linear_every_bucket(weights, k):
    """Bitwise: NVFP4 linear rows alone == rows in the batch, every pinned M bucket."""
    recipe = NVFP4Recipe.strict()
    wq = quantize(_x(N, k, seed=k + 1).float(), block="16x16")
    og = wq.on_grid(torch.bfloat16) if weights == "on-grid" else None
    args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, og, None)
    _assert_rows_equal_in_every_bucket(
        lambda a: gi.nvfp4_gemm.cuda_linear(a, *args, recipe, None), _x(300, k, seed=k)
    )


@pytest.mark.parametrize("k", KS)
def test_bf16_invariant_linear_every_bucket(k):
    """Bitwise: the BF16 invariant linear's rows alone == rows in the batch, every M bucket."""
    w = _x(N, k, seed=k + 1)
    _assert_rows_equal_in_every_bucket(
        lambda a: gi.invariant_linear_kernel(a, w, None, torch.bfloat16), _x(300, k, seed=k)
    )


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("per_expert", [2, 17, 70])
def test_grouped_equals_experts_alone(per_expert, k):
    """Bitwise: the grouped GEMM over 8 experts (per_expert tokens each) == each expert's rows
    through a dense NVFP4 linear alone."""
    recipe = NVFP4Recipe.strict()
    e = NUM_EXPERTS
    wq = quantize_experts(_x(e, EXPERT_N, k, seed=k + 2).float())
    args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, None, None)
    xs = _x(e * per_expert, k, seed=k + per_expert)
    offsets = (torch.arange(1, e + 1, device=DEVICE) * per_expert).to(torch.int32)
    y = gi.nvfp4_gemm.cuda_linear(xs, *args, recipe, None, offsets=offsets)
    for i in range(e):
        rows = slice(i * per_expert, (i + 1) * per_expert)
        alone = gi.nvfp4_gemm.cuda_linear(
            xs[rows],
            wq.codes[i],
            wq.block_scales[i].view(torch.uint8),
            wq.global_decode[i].reshape(()),
            None,
            None,
            recipe,
            None,
        )
        assert_bitwise_equal(y[rows], alone, f"expert {i}")
