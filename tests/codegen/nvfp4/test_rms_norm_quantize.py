"""fp4_compile::rms_norm_quantize (RMSNorm with its NVFP4 GEMM operand in the epilogue).

Tiers: bitwise (the op == invariant_rms_norm then quantize_activation: y, on-grid operands,
global decodes, and the gradients of x and weight; the Triton kernel in the interpreter == the
unfused kernels: rms_norm, then quantize_triton / quantize_transposed_ongrid); integration
(opcheck); bad input names the argument.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.nvfp4 import gemm as impl
from fp4_compile.testing import assert_bitwise_equal

STRICT = NVFP4Recipe.strict()
ops = torch.ops.fp4_compile


def _x(*shape, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def _unfused(x, w, eps, transposed):
    y = ops.invariant_rms_norm(x, w, eps)
    return (y, *ops.quantize_activation(y.detach(), STRICT.numerics_key, None, transposed))


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("with_weight", [True, False])
def test_fused_op_equals_norm_then_quantize_bitwise(transposed, with_weight):
    """y, the operands and their global decodes, then dX and dweight, bit for bit (M = 3 x 7,
    not a multiple of 16; rows of very different magnitude)."""
    x = (_x(3, 7, 64, seed=1) * torch.logspace(-3, 3, 7)[None, :, None]).requires_grad_()
    w = (1.0 + 0.1 * _x(64, seed=2)).requires_grad_() if with_weight else None
    fused = ops.rms_norm_quantize(x, w, 1e-6, STRICT.numerics_key, transposed)
    unfused = _unfused(x, w, 1e-6, transposed)
    names = ("y", "y on-grid", "y global decode", "y^T on-grid", "y^T global decode")
    for got, want, what in zip(fused, unfused, names):
        assert_bitwise_equal(got, want, what)
    g = _x(3, 7, 64, seed=3)
    inputs = [x] + ([w] if with_weight else [])
    got = torch.autograd.grad(fused[0], inputs, g)
    want = torch.autograd.grad(unfused[0], inputs, g)
    for a, b, what in zip(got, want, ("dX", "dweight")):
        assert_bitwise_equal(a, b, what)


@pytest.mark.parametrize("hidden", [64, 48, 256])
def test_kernel_equals_unfused_kernels_interpreter(hidden):
    """Bitwise, the Triton kernel (interpreter on CPU, compiled on CUDA) against the unfused
    kernels: y == the rms_norm kernel's; the on-grid operand and global decode ==
    quantize_triton(y, per_row); the row maxima's X^T operand == quantize_transposed_ongrid(y)
    (per-tensor). Rows per program > 1 at these widths, H not a power of two included."""
    from fp4_compile.codegen.invariant.rms_norm_kernel import rms_norm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.codegen.nvfp4.rms_norm_quantize_kernel import rms_norm_quantize

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = (_x(37, hidden, seed=4) * torch.logspace(-2, 2, 37)[:, None]).to(dev)
    x[5] = 0.0  # a zero row: amax 0, global encode FLT_MAX
    w = (1.0 + 0.1 * _x(hidden, seed=5)).to(dev)
    y, ongrid, gd, row_amax = rms_norm_quantize(x, w, 1e-6)
    y_ref = rms_norm(x, w, None, 1e-6)[0]
    assert_bitwise_equal(y, y_ref, "y")
    a, gd_a = quantize_triton(y_ref, block="1x16", global_scale="per_row", out="ongrid")
    assert_bitwise_equal(ongrid, a, "on-grid")
    assert_bitwise_equal(gd, gd_a, "global decode")
    assert_bitwise_equal(row_amax, y_ref.abs().amax(dim=-1), "row maxima")
    xt, gd_t = impl.quantize_transposed_ongrid(y_ref, global_scale="per_tensor")
    fused = ops.rms_norm_quantize(x, w, 1e-6, STRICT.numerics_key, True)
    if dev == "cuda":  # the op's CUDA path: the kernel, then X^T from the row maxima
        assert_bitwise_equal(fused[3], xt, "y^T on-grid")
        assert_bitwise_equal(fused[4], gd_t, "y^T global decode")
    else:  # the op's CPU path is the reference: the kernels' operands equal it
        assert_bitwise_equal(xt, fused[3], "y^T on-grid (kernel vs reference)")
        assert_bitwise_equal(ongrid, fused[1], "on-grid (kernel vs reference)")


def test_opcheck():
    """torch.library.opcheck: schema, fake tensors, autograd registration, aot dispatch."""
    x = _x(2, 5, 32, seed=6).requires_grad_()
    w = (1.0 + 0.1 * _x(32, seed=7)).requires_grad_()
    for transposed in (True, False):
        torch.library.opcheck(
            ops.rms_norm_quantize.default, (x, w, 1e-6, STRICT.numerics_key, transposed)
        )
    torch.library.opcheck(ops.rms_norm_quantize.default, (x, None, 1e-6, STRICT.numerics_key, True))


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="per_row"):
        ops.rms_norm_quantize(_x(4, 32), None, 1e-6, NVFP4Recipe.te().numerics_key, False)
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm_quantize(_x(4, 32), _x(16), 1e-6, STRICT.numerics_key, False)
    with pytest.raises(ValueError, match="multiple of 16"):
        ops.rms_norm_quantize(_x(4, 24), None, 1e-6, STRICT.numerics_key, False)


@pytest.mark.parametrize(("rows", "hidden"), [(1, 4096), (1, 1040), (3, 64), (21, 256)])
def test_split_form_equals_one_launch_interpreter(rows, hidden):
    """Bitwise (interpreter on CPU, compiled on CUDA): the split form (the norm and its row
    maxima, then `row_codes_kernel` over column chunks: a row at batch 1 is many programs) ==
    the one-launch form == the unfused kernels, for every output; M = 1 wide rows (H not a
    power of two included), several M, a zero row and a NaN row."""
    from fp4_compile.codegen.invariant.rms_norm_kernel import rms_norm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.codegen.nvfp4.rms_norm_quantize_kernel import rms_norm_quantize

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = (_x(rows, hidden, seed=rows) * torch.logspace(-2, 2, rows)[:, None]).to(dev)
    if rows > 2:
        x[1] = 0.0
        x[2, 3] = float("nan")
    w = (1.0 + 0.1 * _x(hidden, seed=6)).to(dev)
    split = rms_norm_quantize(x, w, 1e-6, split=True)
    whole = rms_norm_quantize(x, w, 1e-6, split=False)
    for got, want, what in zip(split, whole, ("y", "on-grid", "global decode", "row maxima")):
        assert_bitwise_equal(got, want, f"{what} (split vs one launch)")
    y_ref = rms_norm(x, w, None, 1e-6)[0]
    assert_bitwise_equal(split[0], y_ref, "y")
    ongrid, gd = quantize_triton(y_ref, block="1x16", global_scale="per_row", out="ongrid")
    assert_bitwise_equal(split[1], ongrid, "on-grid")
    assert_bitwise_equal(split[2], gd, "global decode")
    assert_bitwise_equal(split[3], y_ref.abs().amax(dim=-1), "row maxima")
