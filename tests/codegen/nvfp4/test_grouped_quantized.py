"""fp4_compile::nvfp4_grouped_mm_quantized (the experts' GEMM on x's per-row operand, emitted
by its producer).

Tiers: bitwise (== nvfp4_grouped_mm on the CPU reference: forward, dX and dW, with and without
the folded token gather, masked rows and empty experts included; the kernel path ==
cuda_linear's grouped launch in the Triton interpreter); integration (opcheck); bad input names
the argument.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.codegen.nvfp4 import gemm as impl
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal

STRICT = NVFP4Recipe.strict()
ops = torch.ops.fp4_compile
OFFSETS = [5, 5, 22, 29]  # expert 1 empty


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2


def _experts(e, n, k, seed=3):
    w = _x(e, n, k, seed=seed).requires_grad_()
    wq = ref.quantize_experts(w.detach())
    return w, (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode)


def _operands(x):
    q = ref.quantize(x.detach(), block="1x16", global_scale="per_row")
    return q.on_grid(torch.bfloat16), q.global_decode


@pytest.mark.parametrize("gathered", [False, True])
def test_equals_nvfp4_grouped_mm_bitwise(gathered):
    k = 64
    x = _x(29 if not gathered else 11, k, seed=1).requires_grad_()
    x_index = (
        torch.tensor(
            [
                3,
                0,
                -1,
                7,
                10,
                2,
                2,
                5,
                1,
                9,
                -1,
                4,
                8,
                6,
                0,
                1,
                3,
                10,
                7,
                5,
                -1,
                2,
                6,
                9,
                4,
                8,
                1,
                0,
                3,
            ]
        )
        if gathered
        else None
    )
    w, wq = _experts(4, 32, k)
    offsets = torch.tensor(OFFSETS, dtype=torch.int32)
    args = (x, w, *wq, offsets, None, STRICT.numerics_key, None, 5, x_index, None)
    g = _x(29, 32, seed=4)

    def run(op, *extra):
        set_sr_state(None)
        y = op(*args, *extra)
        return (y, *torch.autograd.grad(y, (x, w), g))

    got = run(ops.nvfp4_grouped_mm_quantized, *_operands(x))
    want = run(ops.nvfp4_grouped_mm)
    for a, b, what in zip(got, want, ("y", "dX", "dW")):
        assert_bitwise_equal(a, b, f"{what} (gathered={gathered})")


def test_kernel_path_equals_cuda_linear_interpreter():
    """Bitwise, kernels (interpreter on CPU, compiled on CUDA): the grouped launch on given
    operands == cuda_linear's grouped launch, which quantizes x itself (gathered rows too)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = _x(11, 64, seed=2).to(dev)
    x_index = torch.tensor([3, 0, -1, 7, 10, 2, 2, 5, 1, 9, -1, 4, 8, 6, 0, 1], device=dev)
    _, (codes, scales, gd_w) = _experts(4, 32, 64)
    codes, scales, gd_w = codes.to(dev), scales.to(dev), gd_w.to(dev)
    offsets = torch.tensor([5, 5, 12, 16], dtype=torch.int32, device=dev)
    a, gd, _, _ = impl.cuda_activation_operands(x, STRICT, None, transposed=False)
    got = impl.cuda_grouped_quantized(a, gd, codes, scales, gd_w, None, offsets, x.dtype, x_index)
    want = impl.cuda_linear(
        x, codes, scales, gd_w, None, None, STRICT, None, offsets=offsets, x_index=x_index
    )
    assert_bitwise_equal(got, want, "grouped forward on given operands")


def test_opcheck():
    x = _x(10, 32, seed=5).requires_grad_()
    w, wq = _experts(2, 32, 32)
    off = torch.tensor([4, 10], dtype=torch.int32)
    a, gd = _operands(x)
    torch.library.opcheck(
        ops.nvfp4_grouped_mm_quantized.default,
        (x, w, *wq, off, None, STRICT.numerics_key, None, 0, None, None, a, gd),
    )


def test_bad_input_names_the_argument():
    x = _x(10, 32, seed=5)
    w, wq = _experts(2, 32, 32)
    off = torch.tensor([4, 10], dtype=torch.int32)
    a, gd = _operands(x)
    base = (x, w, *wq, off, None, STRICT.numerics_key, None, 0, None, None)
    with pytest.raises(ValueError, match="x_ongrid"):
        ops.nvfp4_grouped_mm_quantized(*base, a[:4], gd)
    with pytest.raises(ValueError, match="x_gd"):
        ops.nvfp4_grouped_mm_quantized(*base, a, gd.reshape(-1))
    bad_off = (x, w, *wq, off.long(), None, STRICT.numerics_key, None, 0, None, None)
    with pytest.raises(TypeError, match="offsets"):
        ops.nvfp4_grouped_mm_quantized(*bad_off, a, gd)
    te = (x, w, *wq, off, None, NVFP4Recipe.te().numerics_key, None, 0, None, None)
    with pytest.raises(ValueError, match="per_row"):
        ops.nvfp4_grouped_mm_quantized(*te, a, gd)
