"""The stochastic-rounding stream: uniforms in [0, 1) from a counter-based integer hash of
(seed, element index), computed on the tensor's own device with exact integer arithmetic, so
CPU and GPU give the same bits without drawing on the host (a CPU `torch.Generator` plus a
host-to-device copy cost tens of ms per gradient GEMM at learner sizes).

u[i] = (h(seed, i) >> 8) * 2^-24, with h = mix(lo(i) ^ key) for the "lowbias32" mixer over
uint32 (emulated in int64; every product is split so that it stays below 2^63, hence no
overflow); an index of 2^32 or more (its high word hi(i) != 0) takes a second round,
mix(h ^ hi(i) ^ (key >> 1)). One round, not two, below 2^32: the quantize kernel is ALU-bound on
the H200 (Nsight Compute, 2026-12-04: the integer pipe 89% busy in the stochastic-rounding
quantize) and the second round, which only ever mixed in a zero high word, was a quarter of it.

And the per-call seeds: the lowering gives every NVFP4 GEMM a call-site id (`site_id` of its
module path); at run time `call_seed` mixes it with that site's call counter, so two layers, two
steps or two micro-batches never reuse the same rounding noise. The counters are part of a run's
state: `sr_state()` / `set_sr_state(...)` save and restore them (the GRPO trainer's checkpoints
do).

Under CUDA graphs a replay runs no Python, so a host counter would hand every replay the seed of
the captured call. A call made while a stream is capturing therefore takes its seed from a
DEVICE counter instead (`device_call_seed`: an int64 tensor read and advanced by ops the graph
replays), in its own stream family (`graph_site_key`: host-counted and graph calls of one site
never share a seed). The counters are made before capture (`prepare_device_counters`, called by
the backend at compile time: a tensor made inside a capture would live in the graph's memory
pool) and are part of `sr_state()` too.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass

import torch

M32 = 0xFFFFFFFF


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """(h * c) mod 2^32 for int64 h in [0, 2^32), without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (h * lo + (((h * hi) & 0xFFFF) << 16)) & M32


def mix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x7FEB352D)
    h = h ^ (h >> 15)
    h = _mul32(h, 0x846CA68B)
    return h ^ (h >> 16)


def mix32_int(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x7FEB352D) & M32
    h ^= h >> 15
    h = (h * 0x846CA68B) & M32
    return h ^ (h >> 16)


def sr_key(seed: int) -> int:
    """The 32-bit stream key of a seed (what a kernel drawing the stream in registers needs)."""
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return mix32_int(mix32_int(seed & M32) ^ ((seed >> 32) & M32) ^ 0x9E3779B9)


def sr_uniforms(shape, seed: int, device) -> torch.Tensor:
    """FP32 uniforms in [0, 1) of `shape` on `device`, a pure function of (seed, flat index)."""
    key = sr_key(seed)
    n = 1
    for s in shape:
        n *= int(s)
    idx = torch.arange(n, dtype=torch.int64, device=device)
    return uniforms_at(idx, key).reshape(tuple(shape))


def uniforms_at(idx: torch.Tensor, key: int) -> torch.Tensor:
    """FP32 uniforms of the stream with key `key` (`sr_key(seed)`) at int64 flat indices."""
    h = mix32((idx & M32) ^ key)
    hi = (idx >> 32) & M32  # indices of 2^32 and more take a second round
    h = torch.where(hi != 0, mix32(h ^ hi ^ (key >> 1)), h)
    return (h >> 8).to(torch.float32) * (1.0 / 16777216.0)


def site_id(name: str) -> int:
    """A stable 31-bit id of a GEMM call site (its module path and kind), for `call_seed`."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def site_seed(base: int, site: int) -> int:
    """The stream key of one call site under the recipe's base seed (a constant at trace time)."""
    return mix32_int(sr_key(base) ^ (int(site) & M32))


_lock = threading.Lock()
_counters: dict[int, int] = {}


def call_seed(site_key: int) -> int:
    """A fresh stochastic-rounding seed for one call of the backward GEMMs at a call site
    (`site_key` from `site_seed`); that site's counter advances by one. Per-site counters make
    the seeds independent of the order in which the backward runs the sites (eager autograd
    and a compiled backward graph may order them differently). Layout (< 2^63): bits 36-62 from
    the site key, bits 12-35 the site's call count, bits 0-11 zero, left to the call's
    sub-streams (dgrad seed, wgrad seed + 1, MoE wgrad seed + 1 + e for up to 4094 experts)."""
    with _lock:
        n = _counters.get(site_key, 0)
        _counters[site_key] = n + 1
    return nth_call_seed(site_key, n)


def nth_call_seed(site_key: int, n: int) -> int:
    """The seed `call_seed(site_key)` returns on the site's n-th call (0-based): a pure function."""
    return ((mix32_int(site_key & M32) & 0x7FFFFFF) << 36) | ((n & 0xFFFFFF) << 12)


def sr_state() -> dict[int, int]:
    """The call count of every call site so far in this process (save it with a run), device
    counters included (read from the device: a sync, once per checkpoint)."""
    with _lock:
        return {**_counters, **_device_state()}


def set_sr_state(state: dict[int, int] | None) -> None:
    """Restore the counters (None or {} starts every stream over): resuming a run with its saved
    state continues its rounding streams exactly; a run that starts fresh in a process that
    already trained must reset them to reproduce."""
    if state is not None and not isinstance(state, dict):
        raise TypeError(f"state must be a dict or None, got {type(state).__name__}")
    clean = {}
    for k, v in (state or {}).items():
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"state[{k!r}] must be a non-negative int, got {v!r}")
        clean[int(k)] = v
    with _lock:
        _counters.clear()
        _counters.update(clean)
        for (key, _), counter in _device_counters.items():  # their graph families, else 0
            counter.fill_(_counters.pop(graph_site_key(key), 0))


# ---------------------------------------------------------------------------------------------
# device-side call counters (CUDA graphs)

_device_counters: dict[tuple[int, str], torch.Tensor] = {}


def graph_site_key(site_key: int) -> int:
    """The key of a site's CUDA-graph stream family (distinct from its host-counted family)."""
    return mix32_int((int(site_key) & M32) ^ 0x6A09E667)


def prepare_device_counters(site_keys, device) -> None:
    """Make the device counter of each site on `device` (int64 [1], starting at the count that
    `sr_state()` holds for its graph family, else 0). Call outside any CUDA-graph capture."""
    device = torch.device(device)
    with _lock:
        for key in site_keys:
            slot = (int(key), str(device))
            if slot not in _device_counters:
                start = _counters.pop(graph_site_key(key), 0)
                _device_counters[slot] = torch.full((1,), start, dtype=torch.int64, device=device)


def device_counter(site_key: int, device) -> tuple[torch.Tensor, int]:
    """(the site's device counter, int64 [1]; the high bits of its graph family's seeds): what
    `device_call_seed` combines (and `codegen/nvfp4/device_seed_kernel.next_device_seed`, in one launch)."""
    slot = (int(site_key), str(torch.device(device)))
    counter = _device_counters.get(slot)
    if counter is None:
        raise RuntimeError(
            f"no device stochastic-rounding counter for call site {site_key} on {slot[1]}: "
            "a backward GEMM ran inside a CUDA-graph capture that the minite backend did not "
            "prepare (compile with options={'cuda_graphs': True})"
        )
    return counter, nth_call_seed(graph_site_key(site_key), 0)


def device_call_seed(site_key: int, device) -> torch.Tensor:
    """int64 [1] on `device`: `nth_call_seed(graph_site_key(site_key), n)` for the site's device
    count n, which then advances by one, all as device ops (a CUDA graph replays them)."""
    counter, high = device_counter(site_key, device)
    seed = ((counter & 0xFFFFFF) << 12) | high
    counter.add_(1)
    return seed


@dataclass(frozen=True)
class DeviceSeed:
    """A seed held on the device (`tensor`, int64 [1]: a CUDA-graph call's seed) plus a host
    offset: `seed + k` is another DeviceSeed, with no kernel (the kernels drawing the stream add
    the offset and derive the key themselves). The stream is that of the int seed
    `tensor.item() + offset`."""

    tensor: torch.Tensor
    offset: int = 0

    def __post_init__(self):
        t = self.tensor
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.numel() != 1:
            raise ValueError(
                "a device seed must be an int64 tensor with one element, got "
                f"{getattr(t, 'dtype', type(t).__name__)}{list(getattr(t, 'shape', []))}"
            )
        if not isinstance(self.offset, int) or self.offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {self.offset!r}")

    def __add__(self, k: int) -> DeviceSeed:
        return DeviceSeed(self.tensor, self.offset + int(k))


def _device_state() -> dict[int, int]:
    return {graph_site_key(k): int(c.item()) for (k, _), c in _device_counters.items()}
