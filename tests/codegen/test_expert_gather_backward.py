"""The experts' gather backward through the sort permutation (`codegen/expert_gather_backward.py`)
== `gather_rows`' position-ordered sums over the sorted index (`ops_nvfp4._scatter_gathered`),
bitwise: the Triton kernels (the interpreter here, CUDA on the GPU) on routings like
transformers' experts (`perm` a stable sort of the expert ids, the gather index `perm // k`),
with masked slots (index -1), signed zeros, k a power of two or not; and bad input refused."""

import os

import pytest
import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen.ops_nvfp4 import _scatter_gathered
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
    from fp4_compile.codegen.expert_gather_backward import expert_gather_backward_triton

    tokens, cols = 21, 300  # ragged against the kernel's token and column blocks
    perm, x_index = _routing(tokens, k, experts=8, masked=masked, seed=k)
    grad = torch.randn(tokens * k, cols, generator=torch.Generator().manual_seed(1)) * 4
    grad = grad.to(dtype)
    grad[:, :2] = torch.tensor([-0.0, 0.0])  # the sums start at +0.0: -0.0 + -0.0 stays +0.0
    want = _scatter_gathered(grad, x_index, tokens)  # the CPU reference: sort, then sums
    got = expert_gather_backward_triton(grad.to(DEV), x_index.to(DEV), perm.to(DEV), tokens)
    assert got.dtype == dtype and got.shape == (tokens, cols)
    assert_bitwise_equal(got.cpu(), want, f"k={k} masked={masked}")
    assert not got[:, :2].float().signbit().any()


def test_cpu_path_with_perm_is_the_reference():
    """On the CPU the op keeps the sorted sums (its reference) and checks perm in full."""
    perm, x_index = _routing(6, 2, experts=4, masked=True)
    grad = torch.randn(12, 5)
    assert_bitwise_equal(_scatter_gathered(grad, x_index, 6, perm),
                         _scatter_gathered(grad, x_index, 6), "cpu")  # fmt: skip


def test_bad_perm_is_refused():
    from fp4_compile.codegen.expert_gather_backward import check_perm_precondition

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
