"""fp4_compile::silu_mul: forward and backward are eager autograd's bits for F.silu(a) * b, under
eager and torch.compile alike; bad operands are refused by name."""

import pytest
import torch
import torch.nn.functional as F

from fp4_compile.codegen.invariant.silu_mul import silu_mul
from fp4_compile.testing import assert_autograd_bitwise_equal, assert_bitwise_equal


def _pair(dtype, shape=(6, 40), seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(shape, generator=g) * 4).to(dtype)
    b = torch.randn(shape, generator=g).to(dtype)
    return a, b


def _grads(fn, a, b, grad):
    a, b = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    out = fn(a, b)
    out.backward(grad)
    return out.detach(), a.grad, b.grad


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("compiled", [False, True])
def test_silu_mul_is_eager_autograd_bitwise(dtype, compiled, device):
    """Large enough on CUDA (2M elements) that Inductor's own SwiGLU backward differed there."""
    shape = (6, 40) if device == "cpu" else (2048, 1024)
    a, b = (t.to(device) for t in _pair(dtype, shape))
    grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    fn = torch.compile(silu_mul, backend="inductor", fullgraph=True) if compiled else silu_mul
    got = _grads(fn, a, b, grad)
    want = _grads(lambda x, y: F.silu(x) * y, a, b, grad)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def test_silu_mul_opcheck():
    a, b = _pair(torch.float32)
    torch.library.opcheck(torch.ops.fp4_compile.silu_mul.default, (a, b))


def test_silu_mul_refuses_bad_operands():
    a, b = _pair(torch.float32)
    with pytest.raises(ValueError, match="silu_mul needs a and b"):
        silu_mul(a, b[:, :8])
    with pytest.raises(ValueError, match="silu_mul needs a and b"):
        silu_mul(a, b.to(torch.bfloat16))
    with pytest.raises(TypeError, match="floating"):
        silu_mul(a.to(torch.int32), b.to(torch.int32))


def _halves(dtype, rows, cols, seed, device):
    """a, b as the two halves of one [rows, 2 * cols] tensor (the MoE gate_up output: strided
    rows), with large, tiny, zero, signed-zero and saturating values in a."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2 * cols, generator=g) * torch.logspace(-3, 1.3, 2 * cols)
    x[0, :4] = torch.tensor([0.0, -0.0, 90.0, -90.0])
    gate_up = x.to(dtype).to(device)  # sliced on the device: `.to` would make copies contiguous
    return gate_up[:, :cols], gate_up[:, cols:]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,cols", [(37, 300), (5, 768)])
def test_kernels_equal_the_aten_ops(dtype, rows, cols):
    """Bitwise: the Triton forward and backward (CUDA's path; the interpreter here) == the ATen
    ops eager autograd runs, on strided halves, columns past one tile, rows past a program's.
    On CUDA both call CUDA's expf; in the interpreter only bf16 is compared (its rounding
    absorbs the FP32 ulp that numpy's exp and ATen's CPU exp may differ by)."""
    from fp4_compile.codegen.invariant.silu_mul import silu_mul_backward_reference
    from fp4_compile.codegen.invariant.silu_mul_kernel import (
        silu_mul_backward_triton,
        silu_mul_triton,
    )

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and dtype == torch.float32:
        pytest.skip("FP32 is compared on CUDA (needs a GPU): the interpreter's expf is numpy's")
    a, b = _halves(dtype, rows, cols, rows, dev)
    grad = torch.randn(rows, cols, generator=torch.Generator().manual_seed(3)).to(dtype).to(dev)
    assert not a.is_contiguous() and not b.is_contiguous()
    assert_bitwise_equal(silu_mul_triton(a, b), F.silu(a) * b, "forward")
    got = silu_mul_backward_triton(grad, a, b)
    want = silu_mul_backward_reference(grad, a, b)
    assert_bitwise_equal(got[0], want[0], "grad a")
    assert_bitwise_equal(got[1], want[1], "grad b")


def test_silu_mul_survives_export():
    class SwiGLU(torch.nn.Module):
        def forward(self, gate_up):
            gate, up = gate_up.chunk(2, dim=-1)
            return silu_mul(gate, up)

    x = torch.randn(5, 32)
    ep = torch.export.export(SwiGLU(), (x,))
    assert any("silu_mul" in str(n.target) for n in ep.graph.nodes)
    gate, up = x.chunk(2, dim=-1)
    assert_bitwise_equal(ep.module()(x), F.silu(gate) * up, "exported")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("masked", [False, True])
def test_silu_mul_halves_equals_silu_mul_on_the_chunks(device, masked):
    """silu_mul_halves(x) == silu_mul(*x.chunk(2, -1)) forward, and its ONE gradient of x ==
    autograd's cat of the two halves' gradients, bitwise, with and without a row mask."""
    from fp4_compile.codegen.invariant.silu_mul import silu_mul_halves

    rows, cols = (7, 24) if device == "cpu" else (1024, 768)
    x = torch.cat(_halves(torch.bfloat16, rows, cols, 5, device), dim=-1)
    mask = (torch.arange(rows, device=device) % 3 == 1) if masked else None
    args = () if mask is None else (mask,)
    assert_autograd_bitwise_equal(
        lambda x_: silu_mul_halves(x_, *args),
        lambda x_: silu_mul(*x_.chunk(2, dim=-1), *args),
        (x,),
        "silu_mul_halves vs silu_mul on the chunks",
        grad_seed=6,
    )


def test_silu_mul_halves_kernel_writes_both_halves():
    """The backward kernel into one [R, 2C] tensor == its two-output form (interpreter on CPU)."""
    from fp4_compile.codegen.invariant.silu_mul_kernel import silu_mul_backward_triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and __import__("os").environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    a, b = _halves(torch.bfloat16, 9, 300, 8, dev)
    grad = torch.randn(9, 300, generator=torch.Generator().manual_seed(9)).bfloat16().to(dev)
    mask = torch.arange(9, device=dev) % 4 == 0
    whole = silu_mul_backward_triton(grad, a, b, mask, into_halves=True)
    ga, gb = silu_mul_backward_triton(grad, a, b, mask)
    assert whole.shape == (9, 600) and whole.is_contiguous()
    assert_bitwise_equal(whole[:, :300], ga, "first half")
    assert_bitwise_equal(whole[:, 300:], gb, "second half")


def test_silu_mul_halves_opcheck_and_errors():
    from fp4_compile.codegen.invariant.silu_mul import silu_mul_halves

    x = torch.randn(5, 16)
    torch.library.opcheck(torch.ops.fp4_compile.silu_mul_halves.default, (x,))
    torch.library.opcheck(
        torch.ops.fp4_compile.silu_mul_halves.default, (x, torch.tensor([1, 0, 0, 1, 0]).bool())
    )
    with pytest.raises(ValueError, match=r"\[R, 2C\]"):
        silu_mul_halves(torch.randn(5, 15))
    with pytest.raises(ValueError, match="row_mask"):
        silu_mul_halves(x, torch.ones(4, dtype=torch.bool))
