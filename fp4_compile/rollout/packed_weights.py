"""RolloutEngine(weights="packed"): an engine that holds only the weights its compiled step reads.

The compiled rollout step reads every weight the lowering quantizes from the engine's
`WeightStore` (`weight_store.py`: packed E2M1 codes, E4M3 block scales, global decode), never
its BF16 parameter; only the store's writes read that parameter. So once the store holds a
weight, the parameter's storage is released (`release_stored`: a storage of its own, resized
to 0, as FSDP2 frees its unsharded parameters): the tensor object keeps its shape, stride, dtype
and device (Dynamo's guards, recompiles and the CUDA-graph inputs see the same tensor) and holds
0 bytes.
`update_weights` then quantizes the learner's tensors straight into the store, each moved to
the engine's device (and cast to the parameter's dtype) one weight, or one shared-scale group,
at a time: no BF16 copy is kept. The same quantizer on the same values: the same bytes.

When: the store's entries are made by the first compile of the step (a model's engine: its
first generate, released right after that call's prefill; until then the engine holds both), or
by binding an exported program (an artifact's engine: released at construction).

Refused, naming the option:
- an engine built on the learner's own module (released storage would be the learner's
  weights): its parameters have gradients or feed a learner's weight store at construction, or
  `update_weights` is given the engine's own module; build the engine on a copy;
- compile=False (the stock step runs the module eagerly: it reads every BF16 weight);
- a recipe with quantize=False (it quantizes no weight: nothing to release; refused rather than
  a silent no-op, so `weights="packed"` always means the packed footprint).
The parameters the step reads (embeddings, head, norms, the MoE router: `bf16_modules`) stay.
"""

from __future__ import annotations

import torch

from .weight_store import WeightStore, in_learner_store, released_storage
from .weight_sync import check_learner_weights, full_tensor

WEIGHT_FORMS = {
    "bf16+packed": "BF16 parameters and the packed store (the default)",
    "packed": "the packed store and only the BF16 parameters the step reads",
}


def check_weights_option(weights, *, compile: bool, recipe) -> str:
    """`weights` validated against the engine's other arguments (see the module docstring)."""
    if weights not in WEIGHT_FORMS:
        raise ValueError(f"weights must be one of {tuple(WEIGHT_FORMS)}, got {weights!r}")
    if weights == "packed" and not compile:
        raise ValueError(
            "weights='packed' needs compile=True: the stock (compile=False) step reads every "
            "BF16 weight"
        )
    if weights == "packed" and not recipe.quantize:
        raise ValueError(
            "weights='packed' releases the BF16 weights the recipe quantizes; a recipe with "
            "quantize=False quantizes none (nothing to release): use weights='bf16+packed'"
        )
    return weights


def check_not_learner(model: torch.nn.Module) -> None:
    """Refuse a module that is, by what can be seen, a learner's: released storage would be
    the learner's weights."""
    with_grad = next((n for n, p in model.named_parameters() if p.grad is not None), None)
    if with_grad is not None or in_learner_store(model.parameters()):
        why = f"{with_grad!r} has a gradient" if with_grad else "a learner's weight store reads it"
        raise ValueError(
            f"weights='packed' releases the engine module's quantized weights, and this module "
            f"looks like the learner's ({why}): build the engine on a copy "
            "(RolloutEngine(copy.deepcopy(model), ...)) or use weights='bf16+packed'"
        )


@torch.no_grad()
def release_stored(store: WeightStore, *, keep: set[str] = frozenset()) -> int:
    """Release the storage of every parameter that has a store entry, but those named in
    `keep` (a no-op for those released before); the number of parameters released now.

    The parameter first moves to a storage of its own (`set_`, one weight's bytes for a moment)
    which is then resized to 0: the release never touches a storage other tensors may share (an
    in-memory artifact's program and the model it was exported from; a loaded artifact's
    storage is not resizable at all), and the old one is freed with its last holder."""
    count = 0
    for name in store.entries.keys() - keep:
        p = store.params[name]
        if not released_storage(p):
            p.set_(torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device))
            p.untyped_storage().resize_(0)
            count += 1
    return count


@torch.no_grad()
def update_packed(
    params: dict[str, torch.Tensor], store: WeightStore, learner: torch.nn.Module
) -> None:
    """`learner`'s weights into a packed engine: every name of `params` (the engine's
    parameters, by the learner's names) checked first, the held parameters copied in place,
    the store's entries quantized from the learner's tensors (`WeightStore.refresh(source)`)."""
    theirs = check_learner_weights(params, learner)
    for name, p in params.items():
        if not released_storage(p):
            p.copy_(full_tensor(theirs[name].detach()))
    to_learner = {id(p): name for name, p in params.items()}
    learner_name = {n: to_learner[id(p)] for n, p in store.params.items() if id(p) in to_learner}

    def source(name: str) -> torch.Tensor:
        p = store.params[name]
        t = full_tensor(theirs[learner_name[name]].detach())
        return t.to(device=p.device, dtype=p.dtype)

    store.refresh(source=source)


def held_weight_bytes(params: dict[str, torch.Tensor], store: WeightStore) -> int:
    """Bytes held for weights: every store entry's tensors and the parameters not released."""
    held = sum(p.numel() * p.element_size() for p in params.values() if not released_storage(p))
    for entry in store.entries.values():
        parts = (entry.codes, entry.scales, entry.global_decode, entry.ongrid)
        held += sum(t.numel() * t.element_size() for t in parts if t is not None)
    return held
