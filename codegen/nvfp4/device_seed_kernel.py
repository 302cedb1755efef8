"""Stochastic-rounding seeds held on the device (CUDA graphs), in as few launches as possible.

Under CUDA graphs a replay runs no Python, so a backward's seed comes from a device counter
(`sr_stream.device_call_seed`: four ATen kernels, read-combine-advance). `next_device_seed` does
the same in ONE launch and returns it as an `sr_stream.DeviceSeed`, whose sub-streams (`seed + 1`,
the MoE wgrad's `seed + 1 + e`) are host offsets: the quantize kernel adds them and derives each
stream key itself (`triton_helpers.sr_key_of`), so no key tensors are computed per call either
(they were about ten small kernels per backward GEMM call, replayed at every step).
"""

from __future__ import annotations

import operator

import torch
import triton
import triton.language as tl

from ...sr_stream import DeviceSeed, device_call_seed, device_counter
from ..runtime import interpreting


@triton.jit(do_not_specialize=["high"])
def _next_seed_kernel(counter_ptr, out_ptr, high):
    n = tl.load(counter_ptr)
    tl.store(out_ptr, ((n & 0xFFFFFF) << 12) | high.to(tl.int64))
    tl.store(counter_ptr, n + 1)


def next_device_seed(site_key: int, device) -> DeviceSeed:
    """The site's next device seed, bitwise `sr_stream.device_call_seed` (its counter advances
    by one), in one launch on CUDA (and in the interpreter); the torch ops elsewhere."""
    device = torch.device(device)
    if device.type != "cuda" and not interpreting():
        return DeviceSeed(device_call_seed(site_key, device))
    counter, high = device_counter(site_key, device)
    out = torch.empty((1,), dtype=torch.int64, device=device)
    _next_seed_kernel[(1,)](counter, out, high)
    return DeviceSeed(out)


def seed_launch_args(seed, device: torch.device) -> tuple[int, torch.Tensor | None, int]:
    """(host seed, device seed tensor or None, offset) for the quantize kernel, of an int seed,
    an int64 [1] tensor on `device` holding one, or a `DeviceSeed` there."""
    if isinstance(seed, torch.Tensor):
        seed = DeviceSeed(seed)
    if isinstance(seed, DeviceSeed):
        if seed.tensor.device != device:
            raise ValueError(f"the seed tensor is on {seed.tensor.device}, the data on {device}")
        return 0, seed.tensor, seed.offset
    try:
        value = operator.index(seed)
    except TypeError:
        value = -1
    if isinstance(seed, bool) or not 0 <= value < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63) or a device seed, got {seed!r}")
    return value, None, 0
