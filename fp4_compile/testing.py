"""Test helpers shared by tests and benchmarks (no pytest import here)."""

from __future__ import annotations

import math

import torch

from .codegen.nvfp4.op_args import QuantizeArg, QuantizeOut
from .format import NVFP4Tensor
from .passes import run_pipeline


def _raw(t: torch.Tensor) -> torch.Tensor:
    """t's bytes in element order (a fresh copy: a one-element view keeps its stride through
    `contiguous()`, and a byte view needs stride 1)."""
    flat = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
    return flat.copy_(t.detach().reshape(-1)).view(torch.uint8)


def count_bytes_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of differing ELEMENTS compared by raw bits (so -0.0 != 0.0 and NaN == same NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {a.dtype}{list(a.shape)} with {b.dtype}{list(b.shape)}")
    width = a.element_size()
    ra, rb = _raw(a).reshape(-1, width), _raw(b).reshape(-1, width)
    return int((ra != rb).any(dim=1).sum())


def assert_bitwise_equal(a: torch.Tensor, b: torch.Tensor, what: str = "tensors") -> None:
    """Raise AssertionError reporting how many elements differ (and the first one)."""
    n = count_bytes_differ(a, b)
    if n:
        fa, fb = a.detach().reshape(-1), b.detach().reshape(-1)
        width = a.element_size()
        diff = (_raw(a).reshape(-1, width) != _raw(b).reshape(-1, width)).any(dim=1)
        i = int(diff.nonzero()[0])
        raise AssertionError(
            f"{what}: {n} of {a.numel()} elements differ bitwise; first at flat index {i}: "
            f"{fa[i].item()!r} vs {fb[i].item()!r}"
        )


def assert_autograd_bitwise_equal(fn_a, fn_b, inputs, what: str = "op", grad_seed: int = 3):
    """fn_a and fn_b on their own leaf copies of `inputs`: forward outputs and the gradient of
    every input, under one random output gradient (`grad_seed`), bitwise. -> fn_a's output."""
    results = []
    for fn in (fn_a, fn_b):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        y = fn(*leaves)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed))
        y.backward(g.to(y.dtype).to(y.device))
        results.append((y.detach(), [leaf.grad for leaf in leaves]))
    (y_a, g_a), (y_b, g_b) = results
    assert_bitwise_equal(y_a, y_b, f"{what}: forward")
    for i, (a, b) in enumerate(zip(g_a, g_b)):
        assert_bitwise_equal(a, b, f"{what}: gradient of input {i}")
    return y_a


def assert_nvfp4_equal(a: NVFP4Tensor, b: NVFP4Tensor, what: str = "NVFP4 tensors") -> None:
    """Bitwise equality of codes, block scales and global scales, each reported separately."""
    if a.shape != b.shape or a.block != b.block:
        raise AssertionError(f"{what}: metadata differ: {a} vs {b}")
    assert_bitwise_equal(a.codes, b.codes, f"{what} codes")
    assert_bitwise_equal(a.block_scales, b.block_scales, f"{what} block scales")
    if a.global_decode.shape != b.global_decode.shape:
        raise AssertionError(
            f"{what}: global scale shapes {a.global_decode.shape} vs {b.global_decode.shape}"
        )
    assert_bitwise_equal(a.global_decode, b.global_decode, f"{what} global scales")


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB (torchao's metric), computed in float64."""
    ref = reference.detach().double()
    noise = (ref - approx.detach().double()).pow(2).mean()
    signal = ref.pow(2).mean()
    if float(noise) == 0.0:
        return math.inf
    return float(10.0 * torch.log10(signal / noise))


def learner_weight_bytes(model, recipe, *inputs, **kwargs) -> dict[str, tuple[torch.Tensor, ...]]:
    """{parameter name: (codes, E4M3 block scales, global decode)} exactly as the learner's
    lowered graph quantizes each weight, from one forward of `model` on these inputs (Dynamo and
    the pass pipeline, the lowered graph run eagerly, every weight-quantize node's output kept)."""
    ops = torch.ops.fp4_compile
    quantizes = (ops.quantize.default, ops.quantize_with_ongrid.default)
    seen: dict[int, tuple[torch.Tensor, ...]] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if (
                n.op == "call_function"
                and n.target in quantizes
                and n.args[QuantizeArg.BLOCK] == "16x16"
            ):
                x = self.env[n.args[QuantizeArg.X]]
                codes = out[QuantizeOut.CODES]
                scales, gd = out[QuantizeOut.BLOCK_SCALES], out[QuantizeOut.GLOBAL_DECODE]
                seen[x.data_ptr()] = (
                    codes.clone(),
                    scales.view(torch.float8_e4m3fn).clone(),
                    gd.clone(),
                )
            return out

    def backend(gm, example_inputs, **unused):
        run_pipeline(gm, recipe)
        return lambda *args: Recorder(gm).run(*args)

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend=backend, fullgraph=True)(*inputs, **kwargs)
    finally:
        torch._dynamo.reset()
    names = {p.data_ptr(): name for name, p in model.named_parameters()}
    return {names[ptr]: q for ptr, q in seen.items() if ptr in names}
