"""Stochastic-rounding stream keys of a seed held on the device, in one launch.

Under CUDA graphs the backward's seed is an int64 [1] tensor (`sr_stream.device_call_seed`), so
its stream keys must be computed on the device too: key i = `sr_stream.sr_key(seed + first + i)`
for i < count (the dgrad's key, the wgrad's, one per expert for the MoE wgrad). In torch ops
that is about 27 small kernels per key set (`sr_stream.sr_keys_of`), replayed at every step;
here it is one, with the same uint32 mixer as the quantize kernel, bitwise the same keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..sr_stream import sr_keys_of
from .quantize_kernel import _mix32
from .runtime import interpreting


@triton.jit
def _sr_keys_kernel(seed_ptr, out_ptr, first, count, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.load(seed_ptr) + first + i  # int64, < 2**63 (sr_stream.nth_call_seed's layout)
    lo = (s & 0xFFFFFFFF).to(tl.uint32)
    hi = (s >> 32).to(tl.uint32)
    key = _mix32(_mix32(lo) ^ hi ^ 0x9E3779B9)
    tl.store(out_ptr + i, key.to(tl.int64), mask=i < count)


def device_sr_keys(seed: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """int64 [count] on the seed's device: `sr_key(seed + first + i)`, bitwise
    `sr_stream.sr_keys_of` (which plain CPU tensors use: there is no kernel to launch)."""
    if seed.dtype != torch.int64 or seed.numel() != 1:
        raise ValueError(
            f"seed must be an int64 tensor with one element, got {seed.dtype}{list(seed.shape)}"
        )
    if seed.device.type != "cuda" and not interpreting():
        return sr_keys_of(seed, first, count)
    out = torch.empty((count,), dtype=torch.int64, device=seed.device)
    if count:
        block = 128
        _sr_keys_kernel[(triton.cdiv(count, block),)](seed, out, first, count, BLOCK=block)
    return out
