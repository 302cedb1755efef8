"""One `invariant_linear` over a group's weights concatenated along N (q/k/v, gate/up:
`passes/fuse_group_linears.py`) == the members' linears, column for column.

Tier: bitwise. Each output column is X's row dotted with ONE weight row in an order pinned by
(K, the op) alone, so the fused call's column slices equal the separate calls' outputs, raw
bytes: the CPU reference op (always), the Triton kernel in the interpreter (CPU, no GPU), and
the compiled kernel on the GPU at Qwen3-8B's q/k/v and gate/up shapes (`gpu` marker). The
members' row counts put their first columns off the kernel's N-tile boundaries, so the fused
call's tiles straddle members (a K chain that followed the tile would show).
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
# (member rows, K): q/k/v and gate/up, small; the GPU test's are Qwen3-8B's
SMALL = [((40, 24, 24), 96), ((72, 72), 64)]
QWEN3_8B = [((4096, 1024, 1024), 4096), ((12288, 12288), 4096)]


def _case(rows, k, m, *, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device).bfloat16()
    ws = [torch.randn(n, k, generator=g, device=device).bfloat16() for n in rows]
    return x, ws


def _check(linear, rows, k, m, out_dtype, *, device="cpu"):
    x, ws = _case(rows, k, m, device=device)
    fused = linear(x, torch.cat(ws), None, out_dtype)
    start = 0
    for i, w in enumerate(ws):
        alone = linear(x, w, None, out_dtype)
        part = fused[:, start : start + w.shape[0]]
        assert_bitwise_equal(part, alone, f"member {i} of {rows}, M={m}, {out_dtype}")
        start += w.shape[0]


@pytest.mark.parametrize("rows,k", SMALL)
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_reference_op_fused_equals_members(rows, k, m, out_dtype):
    _check(ops.invariant_linear, rows, k, m, out_dtype)


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
@pytest.mark.parametrize("rows,k", SMALL)
@pytest.mark.parametrize("m", [1, 17])
def test_kernel_fused_equals_members_interpreter(rows, k, m):
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant import linear_kernel

    _check(linear_kernel.linear, rows, k, m, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,k", QWEN3_8B)
@pytest.mark.parametrize("m", [1, 16, 64, 200])
def test_kernel_fused_equals_members_gpu(rows, k, m):
    """The compiled kernel (sm_90 tiles: 64 x 64 up to 64 rows, 128 x 128 above), both
    M buckets, bf16 output as the decode step stores it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    _check(ops.invariant_linear, rows, k, m, torch.bfloat16, device="cuda")
