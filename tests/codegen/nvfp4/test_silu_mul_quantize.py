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
    y, ongrid, gd, row_amax = silu_mul_quantize(x[:, :cols], x[:, cols:], mask)
    y_ref = silu_mul_triton(x[:, :cols], x[:, cols:], mask)
    assert_bitwise_equal(y, y_ref, "y")
    a, gd_a = quantize_triton(y_ref, block="1x16", global_scale="per_row", out="ongrid")
    assert_bitwise_equal(ongrid, a, "on-grid operand")
    assert_bitwise_equal(gd, gd_a, "global decode")
    assert_bitwise_equal(row_amax, y_ref.float().abs().amax(dim=-1), "row maxima")


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


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_dense_op_equals_silu_mul_then_quantize_bitwise(transposed, masked):
    """silu_mul_quantize (a dense MLP's: a, b two tensors [B, S, I]) == silu_mul then
    quantize_activation: y, the operands, and the gradients of a and b."""
    a = _x(3, 7, 48, seed=5).requires_grad_()
    b = _x(3, 7, 48, seed=6).requires_grad_()
    mask = (torch.arange(21) % 4 == 1).reshape(3, 7) if masked else None
    fused = ops.silu_mul_quantize(a, b, mask, STRICT.numerics_key, transposed)
    y_ref = ops.silu_mul(a, b, mask)
    unfused = (
        y_ref,
        *ops.quantize_activation(y_ref.detach(), STRICT.numerics_key, None, transposed),
    )
    for got, want, what in zip(fused, unfused, ("y", "on-grid", "gd", "X^T on-grid", "X^T gd")):
        assert_bitwise_equal(got, want, what)
    g = _x(3, 7, 48, seed=7)
    for got, want, what in zip(
        torch.autograd.grad(fused[0], (a, b), g),
        torch.autograd.grad(y_ref, (a, b), g),
        ("da", "db"),
    ):
        assert_bitwise_equal(got, want, what)


def test_transposed_operand_from_row_maxima_interpreter():
    """Bitwise (interpreter on CPU, compiled on CUDA): X^T quantized with the per-tensor amax
    taken from the fused kernel's row maxima == the wgrad's own X^T quantize of y."""
    from fp4_compile.codegen.nvfp4 import gemm as impl
    from fp4_compile.codegen.nvfp4.abs_max_kernel import vector_abs_max
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_tokens_transposed_ongrid
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = _x(37, 96, seed=8).to(dev)
    y, _, _, row_amax = silu_mul_quantize(x[:, :48], x[:, 48:])
    xt, gd_t = quantize_tokens_transposed_ongrid(y, vector_abs_max(row_amax).reshape(1))
    xt_ref, gd_ref = impl.quantize_transposed_ongrid(y, global_scale="per_tensor")
    assert_bitwise_equal(xt, xt_ref, "X^T on-grid")
    assert_bitwise_equal(gd_t.reshape(()), gd_ref, "X^T global decode")


def test_dense_opcheck():
    a = _x(2, 5, 32, seed=9).requires_grad_()
    b = _x(2, 5, 32, seed=10).requires_grad_()
    for transposed in (True, False):
        torch.library.opcheck(
            ops.silu_mul_quantize.default, (a, b, None, STRICT.numerics_key, transposed)
        )


@pytest.mark.parametrize(("rows", "cols"), [(1, 1536), (2, 784), (9, 96), (33, 48)])
def test_split_form_equals_one_launch_interpreter(rows, cols):
    """Bitwise (interpreter on CPU, compiled on CUDA): the split form (column chunks and their
    maxima, then `row_codes_kernel`: a wide row at batch 1 is many programs) == the one-launch
    form == the unfused kernels, for every output; a wide row at M = 1 (many chunk maxima, more
    than one fold step), several M, a NaN row, a zero row and a masked row."""
    from fp4_compile.codegen.invariant.silu_mul_kernel import silu_mul_triton
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = (_x(rows, 2 * cols, seed=rows) * torch.logspace(-2, 2, rows)[:, None]).to(dev)
    mask = None
    if rows > 2:
        x[1, cols + 7] = float("nan")
        x[2] = 0.0
        mask = torch.arange(rows, device=dev) % 4 == 3
    a, b = x[:, :cols], x[:, cols:]
    split = silu_mul_quantize(a, b, mask, split=True)
    whole = silu_mul_quantize(a, b, mask, split=False)
    for got, want, what in zip(split, whole, ("y", "on-grid", "global decode", "row maxima")):
        assert_bitwise_equal(got, want, f"{what} (split vs one launch)")
    y_ref = silu_mul_triton(a, b, mask)
    assert_bitwise_equal(split[0], y_ref, "y")
    ongrid, gd = quantize_triton(y_ref, block="1x16", global_scale="per_row", out="ongrid")
    assert_bitwise_equal(split[1], ongrid, "on-grid operand")
    assert_bitwise_equal(split[2], gd, "global decode")
    assert_bitwise_equal(split[3], y_ref.float().abs().amax(dim=-1), "row maxima")
