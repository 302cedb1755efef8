"""Weights from the learner into a rollout engine, in place.

The engine re-quantizes its weight store from the copied master weights with the learner's
quantizer (`weight_store.py`), so the rollout gets the learner's quantized bytes. An
FSDP2-sharded learner holds DTensors: each is gathered (a collective, in the same order on every
rank) so the engine receives the full, single-process weights.
"""

from __future__ import annotations

import torch


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor shard (a collective), or the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check_learner_weights(
    params: dict[str, torch.Tensor], learner: torch.nn.Module
) -> dict[str, torch.Tensor]:
    """`learner`'s parameters by name, once every name of `params` (name -> the engine's
    tensor) is checked to exist in the learner with the same shape."""
    theirs = dict(learner.named_parameters())
    missing = sorted(set(params) - set(theirs))
    if missing:
        raise ValueError(f"update_weights: the learner has no parameters {missing[:4]}...")
    for name, p in params.items():
        if theirs[name].shape != p.shape:
            raise ValueError(
                f"update_weights: {name!r} is {tuple(theirs[name].shape)}, engine has {tuple(p.shape)}"
            )
    return theirs


@torch.no_grad()
def copy_learner_weights(params: dict[str, torch.Tensor], learner: torch.nn.Module) -> None:
    """Copy `learner`'s parameters into `params` (name -> the engine's tensor), in place.

    Every engine parameter must exist in the learner with the same shape; nothing is copied
    before all names are checked, so a mismatch leaves the engine unchanged."""
    theirs = check_learner_weights(params, learner)
    for name, p in params.items():
        p.copy_(full_tensor(theirs[name].detach()))
