"""A rollout engine's cache of quantized weights: quantize each weight once per weight version,
not once per decode step.

The lowering puts the weight quantizers inside the graph (once per forward: right for the
learner, whose weights change every step). A rollout engine runs that graph for every generated
token with the same weights, so without a cache it re-quantizes every weight per token (on the
H200 that was most of the NVFP4 decode time: `benchmarks/results/2026-12-02_rollout_h200_profile_before_weight_cache.md`).

While a `WeightCache` is active (`with cache:`), `fp4_compile::quantize` of a 16x16, RNE,
data-scaled tensor (what the lowering emits for weights) returns the bytes it computed the first
time for that tensor, as fresh copies (the graph may reuse an op's output buffers; a copy keeps
the cache intact). Bitwise the same values: the very op's result, computed once.

Weights quantized with a group's shared global scale (mode "shared", `NVFP4Recipe.
shared_weight_scale`) depend on the other members too: `fp4_compile::weight_group_amax`, which
runs before the members' quantizes, is cached per group (every member's version), and a miss
there drops the members' quantized entries, so they are recomputed with the new amax.

Key: (data_ptr, shape, strides, dtype, device, mode) plus the tensor's version counter. Fused
optimizers update parameters in place WITHOUT bumping the version counter, so the owner must call
`clear()` whenever the weights may have changed (`RolloutEngine.update_weights` does, also when
the engine shares the learner's module).
"""

from __future__ import annotations

import contextlib
import threading

import torch

_active = threading.local()


class WeightCache:
    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[int, tuple[torch.Tensor, ...]]] = {}
        self._groups: dict[tuple, tuple[tuple[int, ...], torch.Tensor]] = {}
        self.hits = 0
        self.misses = 0
        self._hits_only = False

    def clear(self) -> None:
        self._entries.clear()
        self._groups.clear()

    @contextlib.contextmanager
    def hits_only(self):
        """While active, a miss raises instead of computing: a CUDA-graph capture records kernels
        without running them, so an entry computed inside one would hold unwritten memory."""
        self._hits_only = True
        try:
            yield self
        finally:
            self._hits_only = False

    def __enter__(self) -> WeightCache:
        self._outer = getattr(_active, "cache", None)
        _active.cache = self
        return self

    def __exit__(self, *exc) -> None:
        _active.cache = self._outer

    @staticmethod
    def _key(x: torch.Tensor, mode: str) -> tuple:
        return (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device, mode)

    def _miss(self, x: torch.Tensor) -> None:
        if self._hits_only:
            raise RuntimeError(
                f"weight cache miss for a {tuple(x.shape)} {x.dtype} weight while only hits "
                "are allowed (inside a CUDA-graph capture): run one step without capture first"
            )
        self.misses += 1

    def get(self, x: torch.Tensor, mode: str, compute) -> tuple[torch.Tensor, ...]:
        key = self._key(x, mode)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == x._version:
            self.hits += 1
        else:
            self._miss(x)
            entry = (x._version, tuple(t.clone() for t in compute()))
            self._entries[key] = entry
        return tuple(t.clone() for t in entry[1])

    def group_amax(self, weights: list[torch.Tensor], compute) -> torch.Tensor:
        """The shared amax of a weight group (computed on a miss: any member's version changed,
        or a new group), as a fresh copy; a miss also drops the members' "shared" entries."""
        key = tuple(self._key(w, "group_amax") for w in weights)
        versions = tuple(w._version for w in weights)
        entry = self._groups.get(key)
        if entry is not None and entry[0] == versions:
            self.hits += 1
        else:
            self._miss(weights[0])
            for w in weights:
                self._entries.pop(self._key(w, "shared"), None)
            entry = (versions, compute().clone())
            self._groups[key] = entry
        return entry[1].clone()


def active_cache() -> WeightCache | None:
    """The cache of the innermost `with WeightCache():` block of this thread, or None."""
    return getattr(_active, "cache", None)
