"""benchmarks.multi_gpu's plumbing: the rank roles and process groups, the learner -> engine
weight sync (the learner's NVFP4 bytes, and a BF16 refit as the baseline), and the gradient
comparison figures.

Roles: ranks 0..L-1 are the FSDP2 learner (L = world - 1 with an engine rank, else world); the
engine rank (the last) runs a `RolloutEngine(weights="packed")`: it holds the packed store
(E2M1 codes, E4M3 block scales, FP32 global decode per quantized weight) and only the BF16
parameters its step reads (embeddings, head, norms, router). Learner rank 0 sends, the engine
receives, over a process group of those two ranks (NCCL on GPUs, gloo on the CPU).

The NVFP4 sync: learner rank 0 quantizes each entry of the engine's store from the gathered
full weights with the op and arguments the engine's graph quantizes it with (its
`QuantizeSpec`: `fp4_compile::quantize`, a shared-scale group's `weight_group_amax`), i.e. the
learner's own quantizer, and broadcasts codes, scales and global decode INTO the engine's store
tensors (in place: the engine's compiled step and CUDA graphs read them where they are), then the
held parameters. The BF16 refit: every parameter in the model's dtype, received into buffers
the engine keeps, then quantized by the engine into its store (`WeightStore.refresh(source=)`).
Every tensor travels as its raw bytes (a uint8 view), so gloo needs no FP8 support.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fp4_compile.rollout.weight_store import released_storage

INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class Roles:
    """This process's place: rank, world, the learner ranks, the engine rank (or None), the
    learners' process group and the learner-0 <-> engine group."""

    rank: int
    world: int
    learners: list[int]
    engine: int | None
    learn_group: object
    sync_group: object
    device: torch.device

    @property
    def is_engine(self) -> bool:
        return self.rank == self.engine

    @property
    def num_learners(self) -> int:
        return len(self.learners)


def make_roles(rank: int, world: int, device: torch.device, *, with_engine: bool) -> Roles:
    """The groups, made on every rank (`new_group` is collective, even for non-members)."""
    engine = world - 1 if with_engine else None
    learners = list(range(world - 1 if with_engine else world))
    if not learners:
        raise ValueError(f"world size {world}: no rank left for the learner beside the engine")
    learn_group = dist.new_group(learners) if world > 1 else None
    sync_group = dist.new_group([0, engine]) if engine is not None else None
    return Roles(rank, world, learners, engine, learn_group, sync_group, device)


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of contiguous `t` (writes through it land in `t`)."""
    if not t.is_contiguous():
        raise ValueError(f"sync tensors must be contiguous, got strides {t.stride()}")
    return t.view(-1).view(torch.uint8)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ---- the engine's layout ---------------------------------------------------------------------


def engine_layout(engine) -> dict:
    """What the sender must match: every store entry's spec and tensor shapes / dtypes (sorted
    by name), and the parameters the engine still holds (not released), by name."""
    store = engine.weight_store
    entries = []
    for name in sorted(store.entries):
        e = store.entries[name]
        parts = (e.codes, e.scales, e.global_decode)
        entries.append((e.spec, [(tuple(t.shape), str(t.dtype)) for t in parts]))
    held = sorted(
        n
        for n, p in engine.model.named_parameters()
        if n not in store.entries and not released_storage(p)
    )
    return {"entries": entries, "held": held}


def quantize_entry(spec, full: dict[str, torch.Tensor]):
    """(codes, block scales, global decode) of `spec`'s parameter: the engine graph's own op
    and arguments, on the learner's full weight (the bytes its store would hold)."""
    ops = torch.ops.fp4_compile
    amax = None
    if spec.group:
        amax = ops.weight_group_amax.default([full[m] for m in spec.group])
    w = full[spec.name]
    return ops.quantize.default(w, spec.block, spec.global_scale, amax, spec.rounding, spec.seed)


def _broadcast(t: torch.Tensor, roles: Roles) -> None:
    dist.broadcast(as_bytes(t), src=0, group=roles.sync_group)


# ---- the NVFP4 sync --------------------------------------------------------------------------


@torch.no_grad()
def send_packed(layout: dict, full: dict[str, torch.Tensor], roles: Roles) -> dict:
    """Learner rank 0: quantize every entry of `layout` from `full` and send it, then the held
    parameters. Returns the bytes sent (of them, the held parameters') and the seconds spent
    quantizing."""
    sent, quantize_s = 0, 0.0
    for spec, shapes in layout["entries"]:
        t0 = time.perf_counter()
        parts = quantize_entry(spec, full)
        sync_device(roles.device)
        quantize_s += time.perf_counter() - t0
        got = [(tuple(t.shape), str(t.dtype)) for t in parts]
        if got != [(tuple(s), d) for s, d in shapes]:
            raise ValueError(
                f"{spec.name}: the learner quantizes to {got}, the engine holds {shapes}"
            )
        for t in parts:
            _broadcast(t.contiguous(), roles)
            sent += nbytes(t)
    held = 0
    for name in layout["held"]:
        t = full[name].contiguous()
        _broadcast(t, roles)
        held += nbytes(t)
    return {"bytes": sent + held, "held_param_bytes": held, "quantize_s": quantize_s}


@torch.no_grad()
def recv_packed(engine, layout: dict, roles: Roles) -> int:
    """Engine rank: the learner's bytes straight into the store's tensors and the held
    parameters, in place. Returns the bytes received."""
    store, params = engine.weight_store, dict(engine.model.named_parameters())
    got = 0
    for spec, _ in layout["entries"]:
        e = store.entries[spec.name]
        for t in (e.codes, e.scales, e.global_decode):
            _broadcast(t, roles)
            got += nbytes(t)
    for name in layout["held"]:
        _broadcast(params[name].data, roles)
        got += nbytes(params[name])
    return got


# ---- the BF16 refit (the baseline) -----------------------------------------------------------


@torch.no_grad()
def send_full(full: dict[str, torch.Tensor], roles: Roles) -> int:
    """Learner rank 0: every parameter in the model's dtype, sorted by name."""
    sent = 0
    for name in sorted(full):
        _broadcast(full[name].contiguous(), roles)
        sent += nbytes(full[name])
    return sent


@torch.no_grad()
def recv_full(engine, buffers: dict[str, torch.Tensor], layout: dict, roles: Roles) -> float:
    """Engine rank: every parameter into `buffers` (name -> tensor, kept across steps), then the
    engine's own quantize of them into its store and the held parameters copied. Returns the
    seconds of that quantize."""
    for name in sorted(buffers):
        _broadcast(buffers[name], roles)
    sync_device(roles.device)
    t0 = time.perf_counter()
    engine.weight_store.refresh(source=lambda name: buffers[name])
    params = dict(engine.model.named_parameters())
    for name in layout["held"]:
        params[name].copy_(buffers[name])
    sync_device(roles.device)
    return time.perf_counter() - t0


def store_snapshot(engine) -> list[torch.Tensor]:
    """Copies of every store tensor's bytes, in the layout's order."""
    store = engine.weight_store
    return [
        as_bytes(t).clone()
        for name in sorted(store.entries)
        for t in (
            store.entries[name].codes,
            store.entries[name].scales,
            store.entries[name].global_decode,
        )
    ]


def bytes_differing(a: list[torch.Tensor], b: list[torch.Tensor]) -> int:
    return sum(int((x != y).sum()) for x, y in zip(a, b))


# ---- gradients and weights, N ranks vs one process --------------------------------------------


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    """Elements bit-for-bit equal (count, total), relative L2 ||a - b|| / ||a||, and cosine of
    two same-keyed tensor dicts."""
    equal = total = 0
    for n in a:
        x, y = a[n].detach().cpu().contiguous(), b[n].detach().cpu().contiguous()
        kind = INT_OF_SIZE[x.element_size()]
        equal += int((x.view(kind) == y.view(kind)).sum())
        total += x.numel()
    va = torch.cat([a[n].detach().cpu().flatten() for n in a]).double()
    vb = torch.cat([b[n].detach().cpu().flatten() for n in a]).double()
    norm = float(va.norm())
    return {
        "equal_elements": equal,
        "elements": total,
        "rel_l2": float((va - vb).norm()) / norm if norm else float("nan"),
        "cosine": float(va @ vb) / (norm * float(vb.norm()))
        if norm and vb.norm()
        else float("nan"),
    }
