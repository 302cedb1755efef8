"""Inductor's generated elementwise code rounds like eager ATen, on the GPU, at the Qwen3-30B-A3B
shapes of 4096 tokens (the pass/fail part of `tools.elementwise_numerics_gpu`, whose other
rows are probes).

Bitwise, forward output and every input gradient, compiled with minite's Inductor settings
(`inductor_as_minite`) against eager: the rotary embedding with cos / sin computed in the graph,
the BF16 residual adds, and the MoE SwiGLU as the opaque `fp4_compile::silu_mul` against the plain
`silu(gate) * up` (Inductor's own SwiGLU backward is 2 bytes off eager at this shape, which is
why the `lower_silu_muls` pass emits the op).
"""

import pytest
import torch

from fp4_compile.testing import assert_bitwise_equal
from tools.elementwise_numerics_gpu import candidates, inductor_as_minite

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
TOKENS = 4096
CASES = {"rotary": "rotary", "residual_adds": "residual", "silu_mul_op": "fix:"}


def _run(fn, inputs, grad_idx):
    xs = [x.detach().clone().requires_grad_(i in grad_idx) for i, x in enumerate(inputs)]
    out = fn(*xs)
    g = torch.Generator().manual_seed(1)
    out.backward(torch.randn(out.shape, generator=g).to(out.dtype).to(out.device))
    return out.detach(), [xs[i].grad for i in grad_idx]


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_elementwise_equals_eager(case):
    """Bitwise: the Inductor-compiled subgraph (minite's settings) == its eager reference,
    forward output and the gradient of every input."""
    ((name, fn, inputs, grad_idx, reference),) = [
        c for c in candidates(TOKENS, torch.device(DEVICE)) if c[0].startswith(CASES[case])
    ]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=inductor_as_minite)
    want_y, want_g = _run(reference or fn, inputs, grad_idx)
    got_y, got_g = _run(compiled, inputs, grad_idx)
    assert_bitwise_equal(got_y, want_y, f"{name}: forward")
    for i, (a, b) in zip(grad_idx, zip(got_g, want_g)):
        assert_bitwise_equal(a, b, f"{name}: gradient of input {i}")
