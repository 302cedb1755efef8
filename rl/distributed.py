"""The learner sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`), NVFP4 intact.

What makes the numerics hold across ranks:
- Weights are quantized INSIDE the compiled forward, after FSDP2 has all-gathered each layer's
  parameters: every rank quantizes the full, identical weight with the same quantizer, so a
  per-tensor global scale (16x16 weights) needs no extra all-reduce and the codes equal the
  single-process ones bit for bit.
- The rollout gets full weights: `full_parameters` gathers every parameter (`full_tensor`, a
  collective: call it on every rank, in the same order); `RolloutEngine.update_weights` accepts
  sharded models directly and does this itself.
- Data parallel over whole GRPO groups: rank r takes groups r, r + N, ... so group advantages
  stay local; the token-level loss is divided by the GLOBAL token count (`global_token_count`)
  and FSDP2 averages gradients over ranks, which together give the single-process gradient.

What is and is not bitwise across process counts: the rollout (per-request seeds, batch-invariant
engine) and the learner's forward log-probs are bitwise equal to a single process. Gradients
are not: each rank's weight-gradient GEMM reduces over its own tokens and the reduce-scatter adds
the partial sums (another order), and the NVFP4 wgrad quantizes each rank's dY with its own
per-tensor amax. Runs are reproducible for a fixed N (gloo and NCCL reduce in a fixed ring order
for a fixed world size and message size).
"""

from __future__ import annotations

import torch


def shard_model(model: torch.nn.Module, *, mesh=None) -> torch.nn.Module:
    """fully_shard every decoder layer, then the root (embeddings, final norm, lm_head). In
    place; returns the model. Needs an initialized process group."""
    from torch.distributed.fsdp import fully_shard

    inner = getattr(model, "_orig_mod", model)
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if layers is None:
        raise TypeError(
            f"shard_model expects a transformers causal LM with .model.layers, got {type(inner).__name__}"
        )
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(inner, mesh=mesh)
    return model


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor shard (a collective), or the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter, whole (gathered from the shards: a collective)."""
    inner = getattr(model, "_orig_mod", model)
    return {name: full_tensor(p.detach()).clone() for name, p in inner.named_parameters()}


def rank_groups(num_groups: int, rank: int, world: int) -> list[int]:
    """The GRPO groups rank `rank` of `world` trains on: rank, rank + world, ..."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    return list(range(rank, num_groups, world))


def global_token_count(mask: torch.Tensor) -> torch.Tensor:
    """Sum of the mask over all ranks (all-reduce), clamped to >= 1."""
    import torch.distributed as dist

    n = mask.sum().to(torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(n)
    return n.clamp(min=1.0).to(mask.dtype)
