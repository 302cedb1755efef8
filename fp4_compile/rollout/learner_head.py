"""The learner's head only where it is read, in row chunks: per-token log-probs of a
minite-compiled causal LM without materializing its [tokens x vocabulary] logits.

Shape legend: N sequences, W padded width, H hidden, V vocabulary, R target rows.

`torch.compile(model, backend="minite")` lowers the whole causal LM, head included; a forward
then returns [N, W, V] logits (10 GB in FP32 at 16k tokens x 151,936). For log-probs the learner
instead runs the model's decoder through the SAME compile context (the same backend and options,
so the same lowering and weight store) to its last hidden states, and hands the rows it reads to
`codegen/invariant/head_logprobs.py`: the lowering's BF16 head and the shared log-prob op, a
chunk of rows at a time, with a backward that recomputes each chunk. Rows never interact, so
the log-probs are bitwise those of the full-logits forward and of the engine (which runs the
head on one row per request, `rollout/step.py`) at every chunk size.

A model compiled with another backend, or not compiled, keeps its own full forward (its numerics
are its own), and so does an FSDP2-sharded learner (see `chunked_head_parts`); a minite recipe that quantizes the head is refused by name (the chunked head is the
BF16 head the recipe's `bf16_modules` keeps).
"""

from __future__ import annotations

import weakref

import torch

from ..dynamo_guard import no_silent_eager_fallback
from ..recipe import NVFP4Recipe, as_recipe
from ..weight_policy import names_module

DEFAULT_CHUNK_ROWS = 2048
"""Rows per head chunk: at V = 151,936 one chunk's FP32 working logits are 1.2 GB."""

_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def minite_options(model) -> dict | None:
    """The options a `torch.compile(..., backend="minite", options=...)` module was compiled
    with, or None when `model` is not a minite-compiled module."""
    ctx = getattr(model, "dynamo_ctx", None)
    backend = getattr(ctx, "callback", None)
    for _ in range(8):  # Dynamo's wrappers around the backend, down to torch.compile's own
        if backend is None:
            return None
        if getattr(backend, "compiler_name", None) == "minite":
            return dict((getattr(backend, "kwargs", None) or {}).get("options") or {})
        backend = getattr(backend, "_torchdynamo_orig_backend", None)
    return None


def _head_name(inner: torch.nn.Module, head: torch.nn.Module) -> str:
    for name, module in inner.named_modules():
        if module is head:
            return name
    raise TypeError(f"{type(inner).__name__}.get_output_embeddings() is not one of its modules")


def check_bf16_head(recipe: NVFP4Recipe, inner: torch.nn.Module) -> torch.nn.Module:
    """The output embedding, after checking the recipe keeps it BF16 (the chunked head's op)."""
    head = inner.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise TypeError(
            f"{type(inner).__name__}: the chunked head needs a bias-free output embedding"
        )
    name = _head_name(inner, head)
    if recipe.quantize and not any(names_module(name, p) for p in recipe.bf16_modules):
        raise ValueError(
            f"recipe.bf16_modules {recipe.bf16_modules} does not keep the head {name!r} in BF16: "
            "the row-chunked learner head computes the BF16 head; add a pattern for it, or pass "
            "chunk_rows=None to compute full logits"
        )
    return head


def chunked_head_parts(model):
    """(compiled decoder, head weight) of a minite-compiled causal LM, or None for any other
    model (see the module doc)."""
    options = minite_options(model)
    if options is None:
        return None
    inner = model._orig_mod
    if any(type(p).__name__ == "DTensor" for p in inner.parameters()):
        # FSDP2 gathers the shards in the root module's forward hooks, which the decoder called
        # alone would bypass: a sharded learner keeps the full forward (the same log-probs; the
        # row-chunked head under FSDP2 is not built yet)
        return None
    head = check_bf16_head(as_recipe(options.get("recipe")), inner)
    cfg = getattr(inner.config, "text_config", None) or inner.config
    if getattr(cfg, "final_logit_softcapping", None) is not None:
        raise ValueError(
            f"{type(inner).__name__} soft-caps its logits: pass chunk_rows=None (full logits)"
        )
    if model not in _DECODERS:
        _DECODERS[model] = model.dynamo_ctx(inner.get_decoder())
    return _DECODERS[model], head.weight


def learner_memory_floor(config, tokens: int, *, chunk_rows: int, grad: bool) -> dict:
    """Bytes a learner pass of `tokens` tokens needs at the least, beyond the weights (each term
    is certain, the sum a lower bound, so a refusal is never wrong): the residual stream each
    decoder layer saves for the backward (its BF16 input, [tokens, H]; only when `grad`), the
    last hidden states [tokens, H] BF16, and one head chunk's FP32 logits [chunk_rows, V]."""
    cfg = getattr(config, "text_config", None) or config
    hidden, vocab = cfg.hidden_size, cfg.vocab_size
    terms = {
        "saved layer inputs": (cfg.num_hidden_layers * tokens * hidden * 2) if grad else 0,
        "last hidden states": tokens * hidden * 2,
        "one head chunk": min(chunk_rows, tokens) * vocab * 4,
    }
    return terms


def check_learner_fits(config, ids_NW: torch.Tensor, *, chunk_rows: int, free_bytes=None):
    """Refuse, before the forward, a learner batch the device cannot hold even by the floor of
    `learner_memory_floor` (naming the shape and the bytes), instead of failing in the
    allocator minutes in. CPU tensors are not checked (free_bytes: for tests)."""
    if free_bytes is None:
        if ids_NW.device.type != "cuda":
            return
        free_bytes, _total = torch.cuda.mem_get_info(ids_NW.device)
    n, w = ids_NW.shape
    terms = learner_memory_floor(config, n * w, chunk_rows=chunk_rows, grad=torch.is_grad_enabled())
    need = sum(terms.values())
    if need > free_bytes:
        parts = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in terms.items() if v)
        raise ValueError(
            f"a learner batch of {n} x {w} tokens needs at least {need / 2**30:.2f} GiB beyond "
            f"the weights ({parts}); {free_bytes / 2**30:.2f} GiB are free on {ids_NW.device}: "
            "use fewer or shorter sequences per micro-batch (or a smaller chunk_rows)"
        )


def learner_hidden(decoder, ids_NW: torch.Tensor, *, chunk_rows: int = DEFAULT_CHUNK_ROWS):
    """The decoder's last hidden states [N, W, H] (one forward, no cache), after checking the
    batch can fit (`check_learner_fits`)."""
    check_learner_fits(getattr(decoder, "_orig_mod", decoder).config, ids_NW, chunk_rows=chunk_rows)
    with no_silent_eager_fallback():
        return decoder(input_ids=ids_NW, use_cache=False).last_hidden_state


def head_token_logprobs(
    hidden_RH: torch.Tensor,
    head_weight: torch.Tensor,
    targets_R: torch.Tensor,
    temperature: float,
    chunk_rows: int,
) -> torch.Tensor:
    """FP32 [R] log-probs of `targets` under the BF16 head of `hidden` rows, row-chunked."""
    from ..codegen.invariant.head_logprobs import head_logprobs  # lazy: codegen

    logp, _entropy = head_logprobs(
        hidden_RH, head_weight, targets_R, temperature, chunk_rows=chunk_rows
    )
    return logp
