"""Seed derivation: every seed of a run (its prompts, warm start, sampling, held-out set, the TRL
integration's rollouts) comes from the run's seed and a path of parts, so each stream is named,
reproducible on any machine, and unrelated to its neighbours. Used by the GRPO trainer and the
TRL integration alike (a core module: both import it)."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from (run seed, phase, step, ...): the same parts give the same seed on any
    machine, and nearby parts give unrelated streams."""
    blob = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 1
