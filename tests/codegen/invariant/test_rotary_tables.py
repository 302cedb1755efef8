"""`fp4_compile::rotary_tables`: transformers' rotary cos / sin tables of positions, one launch.

Contracts (bitwise): the op's CPU path is the graph's ops it replaces (FP32 angles of
positions.float()[..., None] * inv_freq.float(), their concatenation, ATen's cos / sin), for
int64 / int32 positions and FP32 / BF16 inverse frequencies; the kernel in the Triton
interpreter computes the same angles and layout: its tables equal the interpreter's own cos / sin
(NumPy's) of the reference's angles byte for byte (the interpreter's trig is not the device's:
libdevice == ATen's CUDA cos / sin is tests/gpu/test_gpu_rotary_tables.py); the op passes
`torch.library.opcheck`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

OP = torch.ops.fp4_compile.rotary_tables
needs_interpreter = pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="the interpreter's trig (NumPy)"
)


def _inv_freq(dim=128, theta=1e6, dtype=torch.float32):
    """transformers' default rotary inverse frequencies (Qwen3: theta 1e6, head dim 128)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return inv.to(dtype)


CASES = {
    "decode": (torch.tensor([[5], [0], [4095]]), _inv_freq()),
    "prefill": (torch.arange(40)[None].repeat(2, 1) + torch.tensor([[0], [7]]), _inv_freq()),
    "int32, bf16 inv_freq": (
        torch.arange(9, dtype=torch.int32)[None] * 977,
        _inv_freq(dtype=torch.bfloat16),
    ),
    "odd frequencies": (torch.tensor([[1, 2, 3]]), _inv_freq(dim=24, theta=1e4)),
}


@pytest.mark.parametrize("name", CASES)
def test_cpu_path_is_the_graph_s_ops(name):
    positions, inv_freq = CASES[name]
    cos, sin = OP(positions, inv_freq)
    angles = positions[..., None].float() * inv_freq.to(torch.float32)
    emb = torch.cat((angles, angles), dim=-1)
    ops = torch.ops.fp4_compile
    assert cos.dtype == sin.dtype == torch.float32
    assert_bitwise_equal(cos, ops.cos(emb), f"{name}: cos")
    assert_bitwise_equal(sin, ops.sin(emb), f"{name}: sin")


@needs_interpreter
@pytest.mark.parametrize("name", CASES)
def test_kernel_angles_and_layout_bitwise(name):
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant.rotary_tables_kernel import rotary_tables

    positions, inv_freq = CASES[name]
    angles = (positions[..., None].float() * inv_freq.float()).numpy()
    emb = torch.from_numpy(np.concatenate([angles, angles], axis=-1))
    cos, sin = rotary_tables(positions, inv_freq)
    assert_bitwise_equal(cos, torch.from_numpy(np.cos(emb.numpy())), f"{name}: cos")
    assert_bitwise_equal(sin, torch.from_numpy(np.sin(emb.numpy())), f"{name}: sin")


@needs_interpreter
def test_kernel_reads_strided_positions():
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant.rotary_tables_kernel import rotary_tables

    wide = torch.tensor([[4, 99], [11, 99], [0, 99]])
    got = rotary_tables(wide[:, :1], _inv_freq())
    want = rotary_tables(wide[:, :1].contiguous(), _inv_freq())
    for g, w, part in zip(got, want, ("cos", "sin")):
        assert_bitwise_equal(g, w, f"strided positions: {part}")


@pytest.mark.parametrize("name", ["decode", "int32, bf16 inv_freq"])
def test_opcheck(name):
    torch.library.opcheck(OP, CASES[name])


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="int64 or int32"):
        OP(torch.zeros(2, 1), _inv_freq())
    with pytest.raises(ValueError, match="1-D"):
        OP(torch.zeros(2, 1, dtype=torch.int64), _inv_freq().double())
