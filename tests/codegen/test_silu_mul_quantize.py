"""fp4_compile::silu_mul_halves_quantize (the experts' SwiGLU with its NVFP4 GEMM operand in the
epilogue).

Tiers: bitwise (the op == silu_mul_halves then the per-row quantize: y, on-grid operand, global
decode, and x's gradient, with and without a row mask; the Triton kernel in the interpreter ==
the unfused kernels, silu_mul_triton then quantize_triton); integration (opcheck); bad input
names the argument.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.testing import assert_bitwise_equal

STRICT = NVFP4Recipe.strict()
ops = torch.ops.fp4_compile


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_op_equals_silu_mul_then_quantize_bitwise(masked, dtype):
    x = _x(21, 96, seed=1).to(dtype).requires_grad_()
    mask = (torch.arange(21) % 5 == 2) if masked else None
    y, a, gd = ops.silu_mul_halves_quantize(x, mask, STRICT.numerics_key)
    y_ref = ops.silu_mul_halves(x, mask)
    a_ref, gd_ref, _, _ = ops.quantize_activation(y_ref.detach(), STRICT.numerics_key, None, False)
    assert_bitwise_equal(y, y_ref, "y")
    assert_bitwise_equal(a, a_ref, "on-grid operand")
    assert_bitwise_equal(gd, gd_ref, "global decode")
    g = _x(21, 48, seed=2).to(dtype)
    (dx,) = torch.autograd.grad(y, x, g)
    (dx_ref,) = torch.autograd.grad(y_ref, x, g)
    assert_bitwise_equal(dx, dx_ref, "dX")


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("cols", [48, 768])
def test_kernel_equals_unfused_kernels_interpreter(masked, cols):
    """Bitwise, the kernel (interpreter on CPU, compiled on CUDA) against silu_mul_triton on the
    halves, then quantize_triton(per row, on-grid); rows not a multiple of BLOCK_R, columns
    spanning several chunks."""
    from fp4_compile.codegen.invariant.silu_mul_kernel import silu_mul_triton
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = (_x(19, 2 * cols, seed=3) * torch.logspace(-2, 2, 19)[:, None]).to(dev)
    mask = (torch.arange(19, device=dev) % 4 == 1) if masked else None
    y, ongrid, gd = silu_mul_quantize(x[:, :cols], x[:, cols:], mask)
    y_ref = silu_mul_triton(x[:, :cols], x[:, cols:], mask)
    assert_bitwise_equal(y, y_ref, "y")
    a, gd_a = quantize_triton(y_ref, block="1x16", global_scale="per_row", out="ongrid")
    assert_bitwise_equal(ongrid, a, "on-grid operand")
    assert_bitwise_equal(gd, gd_a, "global decode")


def test_opcheck():
    x = _x(6, 64, seed=4).requires_grad_()
    torch.library.opcheck(ops.silu_mul_halves_quantize.default, (x, None, STRICT.numerics_key))
    mask = torch.tensor([False, True, False, False, True, False])
    torch.library.opcheck(ops.silu_mul_halves_quantize.default, (x, mask, STRICT.numerics_key))


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="per_row"):
        ops.silu_mul_halves_quantize(_x(4, 64), None, NVFP4Recipe.te().numerics_key)
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.silu_mul_halves_quantize(_x(4, 48), None, STRICT.numerics_key)
    with pytest.raises(ValueError, match="x must be"):
        ops.silu_mul_halves_quantize(_x(4, 64).half(), None, STRICT.numerics_key)
