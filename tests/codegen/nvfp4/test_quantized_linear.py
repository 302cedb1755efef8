"""fp4_compile::quantize_activation and ::nvfp4_linear_quantized (one quantization of X shared by
several GEMMs).

Tiers: bitwise (the op pair == nvfp4_linear, forward and every gradient, on the CPU reference;
the kernel path == cuda_linear / cuda_wgrad in the Triton interpreter); integration (opcheck,
schema positions shared with nvfp4_linear); bad input names the argument.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.codegen.nvfp4 import gemm as impl
from fp4_compile.codegen.nvfp4.gemm_call import OP_ARGS
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal

RECIPES = {"strict": NVFP4Recipe.strict(), "te": NVFP4Recipe.te()}
ops = torch.ops.fp4_compile


def _x(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(dtype)


def _weight(n, k, seed=1):
    w = _x(n, k, seed=seed).requires_grad_()
    wq = ref.quantize(w.detach(), block="16x16")
    return w, (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode)


def _linear_args(x, w, wq, bias, recipe, site=7):
    return (x, w, *wq, bias, None, recipe.numerics_key, None, site)


def _grads(out, inputs):
    set_sr_state(None)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype)
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("preset", sorted(RECIPES))
@pytest.mark.parametrize("transposed", [True, False])
def test_quantized_linear_equals_nvfp4_linear_bitwise(preset, transposed):
    """Three linears on one X (M = 2 x 9, not a multiple of 16): one quantize_activation and
    nvfp4_linear_quantized give nvfp4_linear's outputs and dX, dW, dbias bit for bit."""
    recipe = RECIPES[preset]
    x = _x(2, 9, 64, seed=4).requires_grad_()
    weights = [_weight(n, 64, seed=10 + n) for n in (32, 48, 16)]
    bias = _x(48, seed=9).requires_grad_()
    biases = [None, bias, None]
    plain = [
        ops.nvfp4_linear(*_linear_args(x, w, wq, b, recipe, site=i))
        for i, ((w, wq), b) in enumerate(zip(weights, biases))
    ]
    a, gd, xt, gd_t = ops.quantize_activation(x.detach(), recipe.numerics_key, None, transposed)
    assert xt.numel() == (64 * 32 if transposed else 0)
    shared = [
        ops.nvfp4_linear_quantized(*_linear_args(x, w, wq, b, recipe, site=i), a, gd, xt, gd_t)
        for i, ((w, wq), b) in enumerate(zip(weights, biases))
    ]
    inputs = [x, bias, *(w for w, _ in weights)]
    want = _grads(sum(y.sum() * (i + 1) for i, y in enumerate(plain)), inputs)
    got = _grads(sum(y.sum() * (i + 1) for i, y in enumerate(shared)), inputs)
    for i, (y, y_ref) in enumerate(zip(shared, plain)):
        assert_bitwise_equal(y, y_ref, f"y[{i}] ({preset})")
    for name, g, g_ref in zip(["dX", "dbias", "dW0", "dW1", "dW2"], got, want):
        assert_bitwise_equal(g, g_ref, f"{name} ({preset}, transposed={transposed})")


def test_activation_operands_are_the_reference_quantization():
    """Bitwise: x's on-grid operand is quantize(x, 1x16).on_grid and X^T's is quantize of the
    zero-padded transpose, per tensor (what nvfp4_linear's wgrad quantizes)."""
    x = _x(20, 32, seed=2)
    a, gd, xt, gd_t = ops.quantize_activation(x, RECIPES["strict"].numerics_key, None, True)
    xq = ref.quantize(x, block="1x16", global_scale="per_row")
    assert_bitwise_equal(a, xq.on_grid(torch.bfloat16), "x on-grid")
    assert_bitwise_equal(gd, xq.global_decode, "x global decode")
    xtq = ref.quantize(torch.nn.functional.pad(x.t(), (0, 12)), block="1x16")
    assert xt.shape == (32, 32)
    assert_bitwise_equal(xt, xtq.on_grid(torch.bfloat16), "x^T on-grid")
    assert_bitwise_equal(gd_t, xtq.global_decode, "x^T global decode")


@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_kernel_operands_equal_cuda_linear_and_wgrad_interpreter(preset):
    """Bitwise, kernels (Triton interpreter on CPU, compiled on CUDA): the GEMMs on
    `cuda_activation_operands` equal cuda_linear and cuda_wgrad, which quantize X themselves;
    the kernels' operands equal the reference's."""
    recipe = RECIPES[preset]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = _x(40, 64, seed=5).to(dev)
    dy = _x(40, 32, seed=6).to(dev)
    w, (codes, scales, gd_w) = _weight(32, 64)
    codes, scales, gd_w = codes.to(dev), scales.to(dev), gd_w.to(dev)
    a, gd, xt, gd_t = impl.cuda_activation_operands(x, recipe, None, transposed=True)
    for got, want, what in zip(
        (a, gd, xt, gd_t),
        impl.cpu_activation_operands(x.cpu(), recipe, None, transposed=True),
        ("x on-grid", "x gd", "x^T on-grid", "x^T gd"),
    ):
        assert_bitwise_equal(got.cpu(), want, what)
    y = impl.cuda_linear_quantized(a, gd, codes, scales, gd_w, None, None, torch.float32)
    assert_bitwise_equal(y, impl.cuda_linear(x, codes, scales, gd_w, None, None, recipe, None), "y")
    dw = impl.cuda_wgrad_quantized(dy, xt, gd_t, recipe, 11, out_dtype=torch.float32)
    assert_bitwise_equal(dw, impl.cuda_wgrad(dy, x, recipe, 11), "dW")


def test_opcheck():
    """torch.library.opcheck: schema, fake tensors, autograd registration, aot dispatch."""
    recipe = RECIPES["strict"]
    x = _x(2, 8, 32, seed=3).requires_grad_()
    w, wq = _weight(16, 32)
    operands = ops.quantize_activation(x.detach(), recipe.numerics_key, None, True)
    for transposed in (True, False):
        torch.library.opcheck(
            ops.quantize_activation.default, (x.detach(), recipe.numerics_key, None, transposed)
        )
    torch.library.opcheck(
        ops.nvfp4_linear_quantized.default, (*_linear_args(x, w, wq, None, recipe), *operands)
    )


def test_gemm_positions_shared_with_nvfp4_linear():
    """The first arguments of nvfp4_linear_quantized are nvfp4_linear's, at the same positions
    (`gemm_call.OP_ARGS`: what `GemmCall.of` reads off any NVFP4 linear node)."""
    plain = [a.name for a in ops.nvfp4_linear.default._schema.arguments]
    shared = [a.name for a in ops.nvfp4_linear_quantized.default._schema.arguments]
    assert shared[: len(OP_ARGS["nvfp4_linear"])] == plain


def test_bad_operands_name_the_argument():
    recipe = RECIPES["strict"]
    x = _x(20, 32)
    w, wq = _weight(16, 32)
    a, gd, xt, gd_t = ops.quantize_activation(x, recipe.numerics_key, None, True)
    with pytest.raises(ValueError, match="x_ongrid"):
        ops.nvfp4_linear_quantized(*_linear_args(x, w, wq, None, recipe), a[:4], gd, xt, gd_t)
    with pytest.raises(ValueError, match="xt_ongrid"):
        ops.nvfp4_linear_quantized(*_linear_args(x, w, wq, None, recipe), a, gd, xt[:, :16], gd_t)
    with pytest.raises(ValueError, match="multiple of 16"):
        ops.quantize_activation(_x(4, 24), recipe.numerics_key, None, False)
