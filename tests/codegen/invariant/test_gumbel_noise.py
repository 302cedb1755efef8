"""The Gumbel-noise uniforms kernel (codegen/invariant/gumbel_noise_kernel.py), the CUDA path of
`fp4_compile.rollout.sampling.gumbel_noise`.

Tier: bitwise. The kernel (interpreter on CPU, compiled on CUDA) draws the same FP64 uniforms,
hence the same noise, as the torch form it replaces (frozen below as it stood before the kernel)
for many request keys (edge values of the 32-bit key included) and steps (host ints and device
counters, past 2^31 and 2^32 included), at a vocabulary that is not a multiple of the block.
"""

import pytest
import torch

from fp4_compile.sr_stream import M32, mix32, mix32_int
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _old_noise(keys_B, step, vocab_size):
    """`gumbel_noise` before the kernel (sampling.py at eeb16db), the oracle: (u, noise)."""
    if isinstance(step, torch.Tensor):
        step_key = mix32((mix32(step & M32) ^ (step >> 32) ^ 0x85EBCA6B) & M32)
    else:
        step_key = mix32_int((mix32_int(step & M32) ^ (step >> 32) ^ 0x85EBCA6B) & M32)
    tok = torch.arange(vocab_size, dtype=torch.int64, device=keys_B.device)
    h = mix32(tok[None, :] ^ keys_B[:, None])
    h = mix32(h ^ ((keys_B[:, None] >> 1) ^ step_key))
    u = ((h >> 8).to(torch.float64) + 0.5) * (1.0 / 16777216.0)
    return u, (-torch.log(-torch.log(u))).to(torch.float32)


def _keys(num, seed):
    g = torch.Generator().manual_seed(seed)
    edge = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1], dtype=torch.int64)
    return torch.cat([edge, torch.randint(0, 2**32, (num,), generator=g)]).to(DEV)


@pytest.mark.parametrize("step", [0, 1, 2, 31, 1000, 2**31 - 1, 2**31, 2**32 + 5, 2**40 + 3])
def test_uniforms_equal_the_torch_form_bitwise(step):
    """Contract: kernel u == the old torch form's u, bytes, for a host step and the same step as
    a device counter (int64 0-dim tensor)."""
    from fp4_compile.codegen.invariant.gumbel_noise_kernel import gumbel_uniforms

    keys = _keys(11, seed=step % 1000)
    want, _ = _old_noise(keys, step, 150)
    assert_bitwise_equal(gumbel_uniforms(keys, step, 150), want, f"u at host step {step}")
    counter = torch.tensor(step, dtype=torch.int64, device=DEV)
    assert_bitwise_equal(gumbel_uniforms(keys, counter, 150), want, f"u at device step {step}")


def test_noise_of_many_steps_equals_the_torch_form_bitwise():
    """Contract: the noise `gumbel_noise` returns (its CUDA path: the kernel; on CPU the torch
    form) == the old function's, bytes, over many keys and consecutive steps; and the kernel's u
    gives the old noise through the same two logs."""
    from fp4_compile.codegen.invariant.gumbel_noise_kernel import gumbel_uniforms
    from fp4_compile.rollout.sampling import gumbel_noise

    keys = _keys(27, seed=7)
    for step in range(0, 40, 3):
        want_u, want = _old_noise(keys, step, 97)
        counter = torch.tensor(step, dtype=torch.int64, device=DEV)
        assert_bitwise_equal(gumbel_noise(keys, counter, 97), want, f"noise at step {step}")
        u = gumbel_uniforms(keys, counter, 97)
        assert_bitwise_equal((-torch.log(-torch.log(u))).to(torch.float32), want, f"step {step}")


def test_per_row_steps_draw_each_rows_own_step_bitwise():
    """Contract: with one step per row (an int64 [B] tensor: a continuously batched decode
    program's per-row draw counters), row r's u and noise == the old form's at ITS step alone,
    bytes, for the kernel and `gumbel_noise` alike (steps past 2^31 and 2^32 included, a strided
    step vector too)."""
    from fp4_compile.codegen.invariant.gumbel_noise_kernel import gumbel_uniforms
    from fp4_compile.rollout.sampling import gumbel_noise

    keys = _keys(6, seed=3)
    steps = [0, 1, 7, 2**31 - 1, 2**31, 2**32 + 5, 2**40 + 3, 31, 1000, 2, 5]
    per_row = torch.tensor(steps, dtype=torch.int64, device=DEV)
    strided = torch.tensor([[s, -1] for s in steps], dtype=torch.int64, device=DEV)[:, 0]
    got_u, got_strided = gumbel_uniforms(keys, per_row, 150), gumbel_uniforms(keys, strided, 150)
    got = gumbel_noise(keys, per_row, 150)
    for r, step in enumerate(steps):
        want_u, want = _old_noise(keys[r : r + 1], step, 150)
        assert_bitwise_equal(got_u[r : r + 1], want_u, f"u of row {r} at its step {step}")
        assert_bitwise_equal(got_strided[r : r + 1], want_u, f"u of row {r}, strided steps")
        assert_bitwise_equal(got[r : r + 1], want, f"noise of row {r} at its step {step}")
