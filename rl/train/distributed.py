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

import os
import warnings

import torch
import torch.distributed as dist

from ...rollout.weight_sync import full_tensor


def shard_model(model: torch.nn.Module, *, mesh=None) -> torch.nn.Module:
    """fully_shard every decoder layer, then the root (embeddings, final norm, lm_head). In
    place; returns the model. Needs an initialized process group."""
    # lazy: FSDP costs ~0.5 s at import; a single-process run never needs it
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
    ignore_fsdp_view_warning()
    return model


def ignore_fsdp_view_warning() -> None:
    """Silence exactly FSDP2's "returned a view tensor ... wrong gradients" warning.

    The compiled learner's layers return a view (the lowered GEMM's 2D result reshaped), and
    FSDP2 warns that an in-place op on it would drop its pre-backward hook. Nothing mutates it
    (the next layer and the loss read it out of place), and the 2-process gradients equal the
    1-process ones (tests/rl/train/test_fsdp_gradients.py: relative 1e-7 in eager FP32, 0.002
    through the compiled bf16-recipe learner, the BF16 rounding of each rank's partial sums).
    Every other FSDP2 warning still shows."""
    warnings.filterwarnings(
        "ignore",
        message=r"FSDP2-wrapped module \(.*\) returned a view tensor",
        category=UserWarning,
    )


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
    n = mask.sum().to(torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(n)
    return n.clamp(min=1.0).to(mask.dtype)


# ---- the data-parallel trainer's plumbing (all no-ops in a single process) --------------------


def _dist():
    return dist if dist.is_available() and dist.is_initialized() else None


def rank_world() -> tuple[int, int]:
    """(rank, world size) of the initialized process group, or (0, 1)."""
    dist = _dist()
    return (dist.get_rank(), dist.get_world_size()) if dist else (0, 1)


def barrier() -> None:
    dist = _dist()
    if dist:
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (a copy; the input is left as it is)."""
    dist = _dist()
    out = t.detach().clone()
    if dist:
        dist.all_reduce(out)
    return out


def all_reduce_max(value: int) -> int:
    """The largest `value` over ranks (itself in a single process)."""
    dist = _dist()
    if not dist:
        return value

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _global_order(per_rank: list, num_groups: int, group: int) -> list[int]:
    """Indices into the concatenation of every rank's local rows that put them back in the
    single-process order (rank r holds groups r, r + world, ..., `group` rows each)."""
    world = len(per_rank)
    where = {}
    offset = 0
    for r in range(world):
        for k, g in enumerate(rank_groups(num_groups, r, world)):
            where[g] = offset + k * group
        offset += per_rank[r]
    return [where[g] + j for g in range(num_groups) for j in range(group)]


def gather_groups(t: torch.Tensor, local_groups: list[int], group: int) -> torch.Tensor:
    """Every rank's rows of `t` ([local sequences, ...], whole GRPO groups), gathered on every
    rank in the single-process order. Ranks must hold equally many groups."""
    dist = _dist()
    if not dist:
        return t
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    num_groups = len(local_groups) * dist.get_world_size()
    order = _global_order([p.shape[0] for p in parts], num_groups, group)
    return torch.cat(parts)[torch.tensor(order, device=t.device)]


def gather_group_objects(items: list, local_groups: list[int], group: int) -> list:
    """`gather_groups` for a list of picklable per-sequence items."""
    dist = _dist()
    if not dist:
        return list(items)
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, list(items))
    flat = [x for p in parts for x in p]
    num_groups = len(local_groups) * dist.get_world_size()
    return [flat[i] for i in _global_order([len(p) for p in parts], num_groups, group)]


def _full_options():
    # lazy: distributed checkpointing costs ~0.7 s at import; only sharded runs need it
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model state dict on every rank (a collective), CPU tensors, the same keys
    as a single process's `state_dict()`."""
    inner = getattr(model, "_orig_mod", model)
    return {k: full_tensor(v.detach()).cpu() for k, v in inner.state_dict().items()}


def full_optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The unsharded optimizer state (parameters keyed by name; a collective)."""
    # lazy: distributed checkpointing costs ~0.7 s at import; only sharded runs need it
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    inner = getattr(model, "_orig_mod", model)
    state = get_optimizer_state_dict(inner, optimizer, options=_full_options())
    return _to_cpu(state)


def load_full_optimizer_state(model: torch.nn.Module, optimizer, state: dict) -> None:
    """Load `full_optimizer_state`'s result into a sharded optimizer (every rank)."""
    # lazy: distributed checkpointing costs ~0.7 s at import; only sharded runs need it
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    inner = getattr(model, "_orig_mod", model)
    set_optimizer_state_dict(inner, optimizer, optim_state_dict=state, options=_full_options())


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return full_tensor(obj).cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


# Keep NVLink multicast (NVLS) off on the lent GPUs; NCCL and symmetric memory read these.
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def init_from_env(device: str) -> tuple[int, int]:
    """Under torchrun (WORLD_SIZE > 1): initialize the process group, gloo for CPU and NCCL for
    CUDA (one GPU per local rank, NVLink multicast off). Returns (rank, world)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or dist.is_initialized():
        return rank_world()
    if device.startswith("cuda"):
        for k, v in NCCL_ENV.items():
            os.environ.setdefault(k, v)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return rank_world()
