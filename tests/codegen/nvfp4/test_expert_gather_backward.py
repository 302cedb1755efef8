"""The experts' gather backward through the sort permutation
(`codegen/nvfp4/expert_gather_backward_kernel.py`) == `gather_rows`' position-ordered sums over the
sorted index (`grouped_linear._scatter_gathered`), bitwise: the Triton kernels (the interpreter
here, CUDA on the GPU) on routings like transformers' experts (`perm` a stable sort of the expert
ids, the gather index `perm // k`), with masked slots (index -1), signed zeros, k a power of two
or not; and bad input refused."""

import os

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen.nvfp4.grouped_linear import _scatter_gathered
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _routing(tokens, k, experts, masked, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    perm = torch.sort(ids.reshape(-1), stable=True)[1]
    x_index = perm // k
    if masked:  # the sentinel mask: some slots gather a zero row
        x_index[torch.rand(x_index.shape, generator=g) < 0.25] = -1
    return perm, x_index


def _needs_kernel():
    pytest.importorskip("triton")
    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_kernel_equals_the_sorted_sums(dtype, k, masked):
    _needs_kernel()
    from fp4_compile.codegen.nvfp4.expert_gather_backward_kernel import (
        expert_gather_backward_triton,
    )

    tokens, cols = 21, 300  # ragged against the kernel's token and column blocks
    perm, x_index = _routing(tokens, k, experts=8, masked=masked, seed=k)
    grad = torch.randn(tokens * k, cols, generator=torch.Generator().manual_seed(1)) * 4
    grad = grad.to(dtype)
    grad[:, :2] = torch.tensor([-0.0, 0.0])  # the sums start at +0.0: -0.0 + -0.0 stays +0.0
    q_nan = int((x_index >= 0).nonzero()[0])  # a NaN in a slot that is summed: the sum is NaN
    grad[q_nan, 7] = float("nan")
    grad, x_index, perm = grad.to(DEV), x_index.to(DEV), perm.to(DEV)
    # the sorted sums on the same device (CUDA: gather_rows' kernel; CPU: the reference)
    want = _scatter_gathered(grad, x_index, tokens)
    got = expert_gather_backward_triton(grad, x_index, perm, tokens)
    assert got.dtype == dtype and got.shape == (tokens, cols)
    assert torch.equal(got.isnan(), want.isnan())  # NaN payloads are the implementation's
    assert_bitwise_equal(got.nan_to_num(0.0), want.nan_to_num(0.0), f"k={k} masked={masked}")
    assert not got[:, :2].float().signbit().any()
    assert got[int(x_index[q_nan]), 7].isnan()  # not -0.0 (a BF16 rounding carry)


def _grouped_case(masked):
    from fp4_compile import NVFP4Recipe
    from fp4_compile import reference as ref

    g = torch.Generator().manual_seed(0)
    tokens, k, experts = 6, 2, 4
    perm, x_index = _routing(tokens, k, experts, masked=masked)
    ids = torch.stack(
        [
            torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:k]
            for t in range(tokens)
        ]
    ).reshape(-1)
    offsets = torch.bincount(ids, minlength=experts).cumsum(0).to(torch.int32)
    w = torch.randn(experts, 32, 48, generator=g)
    wq = ref.quantize_experts(w)
    h = torch.randn(tokens, 48, generator=g).to(torch.bfloat16)
    rec = NVFP4Recipe.strict().numerics_key
    rest = (w, wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, offsets, None, rec)
    return h, rest, x_index, perm


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_grouped_op_with_perm_equals_without(masked):
    """`nvfp4_grouped_mm(..., x_index, x_perm)`: forward and the gradients of x and the weight
    == the op without x_perm, bitwise (CPU: the reference path; CUDA: the kernels)."""
    from fp4_compile.sr_stream import set_sr_state

    h, rest, x_index, perm = _grouped_case(masked)
    ops = torch.ops.fp4_compile
    h, x_index, perm = h.to(DEV), x_index.to(DEV), perm.to(DEV)
    rest = tuple(t.to(DEV) if isinstance(t, torch.Tensor) else t for t in rest)
    w, *others = rest

    def run(*tail):
        set_sr_state(None)  # the same stochastic-rounding seeds for both
        h_, w_ = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y = ops.nvfp4_grouped_mm(h_, w_, *others, None, 0, x_index, *tail)
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(y))
        return y.detach(), h_.grad, w_.grad

    for a, b, what in zip(run(perm), run(), ("forward", "grad h", "grad w")):
        assert_bitwise_equal(a, b, what)
    set_sr_state(None)


def test_grouped_op_refuses_a_wrong_perm_and_passes_opcheck():
    h, rest, x_index, perm = _grouped_case(masked=True)
    ops = torch.ops.fp4_compile
    with pytest.raises(ValueError, match=r"x_index\[q\] == x_perm\[q\] // k"):
        ops.nvfp4_grouped_mm(h, *rest, None, 0, x_index, perm.flip(0))
    with pytest.raises(ValueError, match="x_perm needs x_index"):
        ops.nvfp4_grouped_mm(h, *rest, None, 0, None, perm)
    torch.library.opcheck(
        ops.nvfp4_grouped_mm.default, (h.requires_grad_(), *rest, None, 0, x_index, perm)
    )


def test_bad_perm_is_refused():
    from fp4_compile.codegen.nvfp4.expert_gather_backward_kernel import check_perm_precondition

    perm, x_index = _routing(6, 2, experts=4, masked=False)
    with pytest.raises(ValueError, match=r"x_perm must be int32/int64 \[S=12\]"):
        check_perm_precondition(x_index, perm[:-1], 6)
    with pytest.raises(ValueError, match="multiple of x's rows"):
        check_perm_precondition(x_index, perm, 5)
    with pytest.raises(ValueError, match=r"x_index\[q\] == x_perm\[q\] // k"):
        check_perm_precondition(x_index, perm.flip(0), 6)
    with pytest.raises(ValueError, match="a permutation"):
        check_perm_precondition(x_index, torch.zeros_like(perm), 6)
    assert check_perm_precondition(x_index, perm, 6) == 2
