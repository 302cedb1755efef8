"""The embedded rollout engine: batched, seeded generation with a static KV cache, through the
same minite lowering as the learner, returning the processed (post-temperature) FP32 log-probs.

Shape legend: B requests, L prompt length (padded), S_max cache slots, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..codegen.nvfp4.weight_cache import WeightCache
from ..dynamo_guard import no_silent_eager_fallback
from ..recipe import NVFP4Recipe, as_recipe
from .cuda_graph import DecodeGraph
from .kv_cache import StaticKVCache
from .logprobs import token_logprobs
from .sampling import check_filter, filter_logits, gumbel_noise, request_keys, sample
from .step import RolloutStep
from .weight_sync import copy_learner_weights

# generate checks "has every request finished?" (a host sync) once per this many tokens
_EOS_CHECK_EVERY = 8


@dataclass
class RolloutOutput:
    tokens: list[list[int]]
    """Generated token ids per request (prompt excluded)."""
    logprobs: list[torch.Tensor]
    """FP32 [len(tokens[i])] log-probs of the sampled tokens under logits / temperature."""
    finish_reasons: list[str] = field(default_factory=list)
    """"eos" or "length" per request."""


class RolloutEngine:
    """engine = RolloutEngine(model, recipe=NVFP4Recipe.strict()); engine.generate(prompts, ...).

    `source` is a transformers causal LM (the learner's module, not a compiled wrapper). The
    engine compiles it with the `minite` backend and the SAME recipe as the learner, and runs
    prefill and decode through that lowering with a per-sequence static KV cache.

    cuda_graphs=True (CUDA only): within each `generate` call the decode step is captured once
    as a CUDA graph (after one ordinary decode step) and replayed for every later token: the
    same kernels with the same arguments, so the same bits, without the per-op host cost that
    bounds decode at small batch (`cuda_graph.py`).
    """

    def __init__(
        self,
        source,
        *,
        recipe: NVFP4Recipe | dict | None = None,
        device=None,
        max_batch: int = 64,
        max_seq_len: int = 512,
        compile: bool = True,
        expected_fingerprint: str | None = None,
        cuda_graphs: bool = False,
    ):
        from .export import RolloutArtifact, load_rollout

        # quantized weights, once per weight version (codegen/nvfp4/weight_cache.py); update_weights
        # clears it
        self.weight_cache = WeightCache()
        if not isinstance(cuda_graphs, bool):
            raise TypeError(f"cuda_graphs must be a bool, got {cuda_graphs!r}")
        self.cuda_graphs = cuda_graphs
        if isinstance(source, (str, Path)):
            source = load_rollout(source, expected_fingerprint=expected_fingerprint, device=device)
        if isinstance(source, RolloutArtifact):
            self._init_from_artifact(source, recipe=recipe, device=device)
        elif isinstance(source, torch.nn.Module):
            self._init_from_model(
                source,
                recipe=recipe,
                device=device,
                max_batch=max_batch,
                max_seq_len=max_seq_len,
                compile=compile,
            )
        else:
            raise TypeError(
                f"RolloutEngine needs a causal LM module, a RolloutArtifact or an artifact path, got {type(source).__name__}"
            )
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(
                f"cuda_graphs=True needs a CUDA device, the engine runs on {self.device}"
            )

    def _set_shapes(self, cfg, dtype) -> None:
        cfg = getattr(cfg, "text_config", None) or cfg
        get = cfg.get if isinstance(cfg, dict) else lambda k, d=None: getattr(cfg, k, d)
        self.num_layers = get("num_hidden_layers")
        self.num_kv_heads = get("num_key_value_heads")
        self.head_dim = get("head_dim") or get("hidden_size") // get("num_attention_heads")
        self.vocab_size = get("vocab_size")
        self.dtype = dtype

    def _init_from_model(self, model, *, recipe, device, max_batch, max_seq_len, compile) -> None:
        self.model = getattr(model, "_orig_mod", model)
        self.recipe = as_recipe(recipe)
        self.device = (
            torch.device(device) if device is not None else next(self.model.parameters()).device
        )
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self._set_shapes(self.model.config, next(self.model.parameters()).dtype)
        step = RolloutStep(self.model)
        if compile:
            self.step = torch.compile(
                step, backend="minite", options={"recipe": self.recipe, "rollout": True}
            )
        else:
            self.step = step
        self._params = dict(self.model.named_parameters())

    def _init_from_artifact(self, artifact, *, recipe, device) -> None:
        if (
            recipe is not None
            and as_recipe(recipe).fingerprint() != artifact.manifest["fingerprint"]
        ):
            raise ValueError(
                f"recipe {as_recipe(recipe).fingerprint()} differs from the artifact's {artifact.manifest['fingerprint']}"
            )
        self.model = None
        self.recipe = artifact.recipe
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.max_batch = artifact.manifest["max_batch"]
        self.max_seq_len = artifact.manifest["max_seq_len"]
        module = artifact.module().to(self.device)
        dtype = next(iter(module.parameters())).dtype
        self._set_shapes(artifact.model_config, dtype)
        self.step = module
        self._params = {n.removeprefix("model."): p for n, p in module.named_parameters()}

    def update_weights(self, model) -> None:
        """Take the learner's new weights in place (no re-export). The lowering quantizes the
        weights inside the graph with the learner's quantizer, so the bytes are identical.
        Call it after every optimizer step, also when the engine shares the learner's module:
        it drops the engine's quantized-weight cache (fused optimizers update parameters in
        place without bumping their version counters, so the cache cannot see the change)."""
        self.weight_cache.clear()
        src = getattr(model, "_orig_mod", model)
        if src is self.model:
            return
        copy_learner_weights(self._params, src)

    def _new_cache(self, batch: int) -> StaticKVCache:
        return StaticKVCache(
            num_layers=self.num_layers,
            batch=batch,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            max_seq_len=self.max_seq_len,
            dtype=self.dtype,
            device=self.device,
        )

    def _step(self, ids_BT, positions_BT, kv_len_B, cache: StaticKVCache):
        tensors = [t for pair in zip(cache.keys, cache.values) for t in pair]
        with no_silent_eager_fallback(), self.weight_cache:
            return self.step(ids_BT, positions_BT, kv_len_B, *tensors)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | list[int] = 0,
        eos_token_id: int | None = None,
    ) -> RolloutOutput:
        """Generate for token-id prompts of different lengths. `seed` is one int (request i uses
        seed + i) or one seed per request; a request's samples depend only on its own seed.

        temperature=0 decodes greedily (argmax of the logits, ties to the lower token id; top_k,
        top_p and the seeds are then unused), and the returned log-probs are those of the
        unscaled logits: `sequence_logprobs(..., temperature=1.0)` reproduces them."""
        num = len(prompts)
        if num == 0 or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
        if num > self.max_batch:
            raise ValueError(f"{num} prompts exceed max_batch={self.max_batch}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        greedy = temperature == 0
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        if int(lengths.max()) + max_new_tokens > self.max_seq_len:
            raise ValueError(
                f"longest prompt ({int(lengths.max())}) + max_new_tokens ({max_new_tokens}) exceeds "
                f"max_seq_len={self.max_seq_len}"
            )
        seeds = [seed + i for i in range(num)] if isinstance(seed, int) else list(seed)
        if len(seeds) != num:
            raise ValueError(f"seed list has {len(seeds)} entries for {num} prompts")
        check_filter(top_k, top_p)
        keys = request_keys(seeds, self.device)
        cache = self._new_cache(num)
        width = int(lengths.max())
        ids = torch.zeros((num, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        _check_token_ids(ids, self.vocab_size)
        positions = torch.arange(width).expand(num, width).contiguous()
        logits = self._step(
            ids.to(self.device), positions.to(self.device), lengths.to(self.device), cache
        )
        last = logits[torch.arange(num), (lengths - 1).to(self.device)]  # [B, V]

        # Every row runs every step (a finished request's later tokens are dropped below; rows
        # never interact), so the loop needs no host sync except the periodic all-finished check.
        tokens_BN = torch.zeros((num, max_new_tokens), dtype=torch.long, device=self.device)
        logps_BN = torch.zeros((num, max_new_tokens), dtype=torch.float32, device=self.device)
        finished = torch.zeros(num, dtype=torch.bool, device=self.device)
        cur = lengths.to(self.device)
        steps = max_new_tokens
        graph = None  # the decode step as one CUDA graph (cuda_graphs=True), for this call
        for step in range(max_new_tokens):
            if greedy:
                picked = torch.argmax(last.float(), dim=-1)  # the first maximum: lower id wins
                logps_BN[:, step] = token_logprobs(last, picked, 1.0)
            else:
                scaled = last.float() / temperature
                filtered = filter_logits(scaled, top_k=top_k, top_p=top_p)
                picked = sample(filtered, gumbel_noise(keys, step, self.vocab_size))
                logps_BN[:, step] = token_logprobs(last, picked, temperature)
            tokens_BN[:, step] = picked
            if eos_token_id is not None:
                finished |= picked == eos_token_id
                if step % _EOS_CHECK_EVERY == _EOS_CHECK_EVERY - 1 and bool(finished.all()):
                    steps = step + 1
                    break
            if step == max_new_tokens - 1:
                break
            if graph is None and self.cuda_graphs and step >= 1:  # step 0 compiled and warmed
                graph = DecodeGraph(self._step, self.weight_cache, cache, num, self.device)
            if graph is not None:
                logits = graph(picked, cur)
            else:
                logits = self._step(
                    picked[:, None].contiguous(), cur[:, None].contiguous(), cur + 1, cache
                )
            last = logits[:, 0]
            cur = cur + 1
        tokens_all = tokens_BN[:, :steps].cpu()
        logps_all = logps_BN[:, :steps].cpu()
        tokens, logps, reasons = [], [], []
        for i in range(num):
            row = tokens_all[i]
            n, reason = steps, "length"
            if eos_token_id is not None:
                hits = (row == eos_token_id).nonzero()
                if len(hits):
                    n, reason = int(hits[0]) + 1, "eos"
            tokens.append(row[:n].tolist())
            logps.append(logps_all[i, :n].clone())
            reasons.append(reason)
        return RolloutOutput(tokens=tokens, logprobs=logps, finish_reasons=reasons)


def _check_token_ids(ids_BL: torch.Tensor, vocab_size: int) -> None:
    """Every prompt token id lies in [0, vocab_size): an id outside it would index the embedding
    out of bounds (an IndexError deep inside the model on the CPU, garbage on a GPU)."""
    bad = (ids_BL < 0) | (ids_BL >= vocab_size)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"prompts[{i}][{j}] = {int(ids_BL[i, j])} is not a token id in [0, vocab_size={vocab_size})"
        )
