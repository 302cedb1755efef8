"""`fp4_compile::cos` / `sin` (codegen/invariant/trig.py) and the pass that puts them in the
graph (passes/lower_trig.py): ATen's bits for every element wherever it sits in a tensor, the
compiled rotary == the eager rotary, eager autograd's gradients, bad input refused."""

import pytest
import torch

import fp4_compile  # noqa: F401  (registers the ops)
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.recipe import NVFP4Recipe
from fp4_compile.testing import assert_bitwise_equal

OPS = {"cos": (torch.ops.fp4_compile.cos, torch.cos), "sin": (torch.ops.fp4_compile.sin, torch.sin)}


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_element_has_atens_bits_wherever_it_sits(name, dtype):
    """A ragged rollout step holds a request's angles at any offset of a tensor of any length:
    each element's value must not depend on that."""
    op, aten_fn = OPS[name]
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(20_011, generator=gen) * 200 - 100).to(dtype)
    whole = op(x)
    assert_bitwise_equal(whole, aten_fn(x), f"{name} {dtype}")
    for n in (1, 3, 15, 16, 17, 33, 257):
        for off in (0, 1, 5, 16, 9_999):
            assert_bitwise_equal(op(x[off : off + n].clone()), whole[off : off + n], f"{n}@{off}")
            strided = op(x[off : off + 2 * n : 2])
            assert_bitwise_equal(strided, whole[off : off + 2 * n : 2], f"{n}@{off}, stride 2")


def _rotary_inputs(model, seq):
    x = torch.zeros(2, seq, model.config.hidden_size)
    positions = torch.stack([torch.arange(seq), torch.arange(7, 7 + seq)])
    return x, positions


def test_compiled_rotary_equals_eager_rotary():
    """transformers' rotary embedding under the minite backend has the eager module's bits. Left
    to Inductor, CPU cos / sin differ from ATen's on about 30% of FP32 angles."""
    model = tiny_qwen3_moe(seed=0)
    rotary = model.model.rotary_emb
    compiled = torch.compile(rotary, backend="minite", options={"recipe": NVFP4Recipe.strict()})
    for seq in (1, 40):
        x, positions = _rotary_inputs(model, seq)
        want_cos, want_sin = rotary(x, positions)
        got_cos, got_sin = compiled(x, positions)
        assert_bitwise_equal(got_cos, want_cos, f"cos, {seq} positions")
        assert_bitwise_equal(got_sin, want_sin, f"sin, {seq} positions")


def test_inductor_alone_would_differ():
    """The pass matters: Inductor's own cos of the same angles is not ATen's (if this starts to
    fail, Inductor's CPU cos became ATen's and the pass is a no-op on CPU, not wrong)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4096, generator=gen) * 64
    got = torch.compile(lambda t: t.cos(), backend="inductor")(x)
    assert not torch.equal(got, torch.cos(x))


@pytest.mark.parametrize("name", OPS)
def test_gradient_is_eager_autograds(name):
    op, aten_fn = OPS[name]
    gen = torch.Generator().manual_seed(1)
    x = (torch.rand(513, generator=gen) * 20 - 10).requires_grad_()
    grad = torch.randn(513, generator=gen)
    (got,) = torch.autograd.grad(op(x), x, grad)
    (want,) = torch.autograd.grad(aten_fn(x), x, grad)
    assert_bitwise_equal(got, want, f"d {name}")


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    """torch.library.opcheck: schema, fake tensors, autograd registration, aot dispatch."""
    op, _ = OPS[name]
    x = torch.linspace(-7.0, 7.0, 48).reshape(3, 16).requires_grad_()
    torch.library.opcheck(op.default, (x,))


@pytest.mark.parametrize("name", OPS)
def test_integer_input_is_refused_by_name(name):
    op, _ = OPS[name]
    with pytest.raises(TypeError, match=rf"fp4_compile::{name} is for floating tensors, got x"):
        op(torch.arange(4))
