"""A rollout engine's cache of quantized weights: quantize each weight once per weight version,
not once per decode step.

The lowering puts the weight quantizers inside the graph (once per forward: right for the
learner, whose weights change every step). A rollout engine runs that graph for every generated
token with the same weights, so without a cache it re-quantizes every weight per token (on the
H200 that was most of the NVFP4 decode time: `benchmarks/results/2026-12-02_rollout_h200_profile_before_weight_cache.md`).

While a `WeightCache` is active (`with cache:`), `fp4_compile::quantize` of a 16x16, RNE,
data-scaled tensor (what the lowering emits for weights) returns the tensors it computed the
first time for that weight version: the very op's result, computed once, handed out without a
copy. That is safe only where nothing writes into an op's output after its last use: the graphs a
rollout runs are compiled with Inductor's buffer reuse and in-place buffers off (the backend's
`options={"rollout": True}`, `backend.ROLLOUT_INDUCTOR_CONFIG`; the exported rollout's AOTI
package likewise); an eagerly run graph reuses nothing.

An entry is served only for the same live tensor at its same version: the entry holds a weak
reference to the weight, so a freed weight's address reused by another tensor is a miss, and the
version counter catches in-place writes that bump it.

Weights quantized with a group's shared global scale (mode "shared", `NVFP4Recipe.
shared_weight_scale`) depend on the other members too: `fp4_compile::weight_group_amax`, which
runs before the members' quantizes, is cached per group (every member alive at its version), and
a miss there drops the members' quantized entries, so they are recomputed with the new amax.

Fused optimizers update parameters in place WITHOUT bumping the version counter, so the owner
must call `clear()` whenever the weights may have changed (`RolloutEngine.update_weights` does,
also when the engine shares the learner's module).
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch

_active = threading.local()


class WeightCache:
    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[weakref.ref, int, tuple[torch.Tensor, ...]]] = {}
        self._groups: dict[
            tuple, tuple[tuple[weakref.ref, ...], tuple[int, ...], torch.Tensor]
        ] = {}
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
        """x's quantized tensors for `mode`, computed by `compute()` on a miss. The returned
        tensors ARE the cache's (no copy): callers must not write into them."""
        key = self._key(x, mode)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is not None and entry[1] == x._version:
            self.hits += 1
            return entry[2]
        self._miss(x)
        tensors = tuple(compute())
        self._entries[key] = (weakref.ref(x), x._version, tensors)
        return tensors

    def group_amax(self, weights: list[torch.Tensor], compute) -> torch.Tensor:
        """The shared amax of a weight group (computed on a miss: a member died or its version
        changed, or a new group), the cache's own tensor; a miss also drops the members'
        "shared" entries."""
        key = tuple(self._key(w, "group_amax") for w in weights)
        versions = tuple(w._version for w in weights)
        entry = self._groups.get(key)
        if (entry is not None and entry[1] == versions
                and all(ref() is not None for ref in entry[0])):  # fmt: skip
            self.hits += 1
            return entry[2]
        self._miss(weights[0])
        for w in weights:
            self._entries.pop(self._key(w, "shared"), None)
        amax = compute()
        self._groups[key] = (tuple(weakref.ref(w) for w in weights), versions, amax)
        return amax


def active_cache() -> WeightCache | None:
    """The cache of the innermost `with WeightCache():` block of this thread, or None."""
    return getattr(_active, "cache", None)
