"""`fp4_compile::invariant_position_mask`: the step's position mask, its attention kernel
arguments and the attentions' lengths, in one launch.

Contracts (bitwise; integers and booleans): the op's CPU path is the torch ops the step ran (the
mask `rollout/kv_cache.attention_mask_4d` built, `reference.attention_mask_args` of it, zeros and
S), and its kernel (compiled on CUDA, else in the Triton interpreter) equals the CPU path byte
for byte, Tq = 1 (decode) and Tq > 1 (prefill), every edge of positions and lengths (p < 0,
p >= S, kv_len 0 or past S, S not a multiple of 32); the constant flag is what the reference
computes; the op passes `torch.library.opcheck`.
"""

from __future__ import annotations

import pytest
import torch

from fp4_compile.codegen.invariant import decode_reference
from fp4_compile.codegen.invariant import reference as cpu
from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
OP = torch.ops.fp4_compile.invariant_position_mask
PARTS = ("mask", "words", "intervals", "flag", "q_start", "kv_keys")
needs_kernels = pytest.mark.skipif(
    not torch.cuda.is_available() and not interpreting(), reason="needs CUDA or the interpreter"
)


def _old_step_mask(positions_BT, kv_len_B, max_seq_len):
    """The torch ops `attention_mask_4d` ran before the op (the contract's left side)."""
    keys = torch.arange(max_seq_len)
    visible = keys[None, None, :] <= positions_BT[:, :, None]
    visible &= keys[None, None, :] < kv_len_B[:, None, None]
    visible[..., 0] = True
    return visible[:, None]


def _cases():
    g = torch.Generator().manual_seed(0)
    out = {
        "decode": (torch.tensor([[5], [0], [63]]), torch.tensor([6, 1, 64]), 64),
        "decode, 70 slots": (torch.tensor([[40], [69]]), torch.tensor([41, 70]), 70),
        "decode, finished rows": (torch.tensor([[9], [3]]), torch.tensor([4, 9]), 33),
        "edges": (torch.tensor([[-1], [80], [7], [0]]), torch.tensor([3, 90, 0, 0]), 40),
        "prefill": (torch.arange(8)[None].repeat(2, 1) + torch.tensor([[0], [3]]), None, 45),
        "one slot": (torch.tensor([[0], [2]]), torch.tensor([1, 3]), 1),
    }
    pos, _, s = out["prefill"]
    out["prefill"] = (pos, pos[:, -1] + 1 - torch.tensor([0, 2]), s)  # row 1's tail is padding
    pos = torch.randint(-2, 130, (5, 3), generator=g)
    out["random"] = (pos, torch.randint(0, 140, (5,), generator=g), 129)
    return out


CASES = _cases()


@pytest.mark.parametrize("name", CASES)
def test_cpu_path_is_the_step_s_old_ops(name):
    positions, kv_len, s = CASES[name]
    got = OP(positions, kv_len, s)
    mask = _old_step_mask(positions, kv_len, s)
    want = (mask, *cpu.attention_mask_args(mask, positions.shape[1], s))
    want += (torch.zeros(len(kv_len), dtype=torch.int64), torch.full((len(kv_len),), s))
    for g, w, part in zip(got, want, PARTS):
        assert g.dtype == w.dtype and g.shape == w.shape, (part, g.shape, w.shape)
        assert_bitwise_equal(g, w, f"{name}: {part}, op vs the step's old ops")
    assert int(got[3]) == 1  # every row one interval: the kernel's constant flag


@needs_kernels
@pytest.mark.parametrize("name", CASES)
def test_kernel_equals_reference_bitwise(name):
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant.position_mask_kernel import position_mask

    positions, kv_len, s = CASES[name]
    want = decode_reference.position_mask_args(positions, kv_len, s)
    got = position_mask(positions.to(DEV), kv_len.to(DEV), s)
    for g, w, part in zip(got, want, PARTS):
        assert g.dtype == w.dtype and g.shape == w.shape, (part, g.shape, w.shape)
        assert_bitwise_equal(g.cpu(), w, f"{name}: {part}, kernel vs reference")


@needs_kernels
def test_kernel_reads_strided_positions():
    """The decode program's positions are a column view: the kernel reads them by stride."""
    pytest.importorskip("triton")
    from fp4_compile.codegen.invariant.position_mask_kernel import position_mask

    wide = torch.tensor([[4, 99], [11, 99], [0, 99]])
    positions, kv_len = wide[:, :1], torch.tensor([5, 12, 1])
    want = decode_reference.position_mask_args(positions.contiguous(), kv_len, 50)
    got = position_mask(positions.to(DEV), kv_len.to(DEV), 50)
    for g, w, part in zip(got, want, PARTS):
        assert_bitwise_equal(g.cpu(), w, f"strided positions: {part}")


@pytest.mark.parametrize("name", ["decode", "prefill"])
def test_opcheck(name):
    torch.library.opcheck(OP, CASES[name])


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="int64"):
        OP(torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match=r"\[B, Tq\]"):
        OP(torch.zeros(2, 1, dtype=torch.int64), torch.ones(3, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="max_seq_len"):
        OP(torch.zeros(2, 1, dtype=torch.int64), torch.ones(2, dtype=torch.int64), 0)
