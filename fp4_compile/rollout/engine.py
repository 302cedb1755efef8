"""The embedded rollout engine: batched, seeded generation with a static KV cache, through the
same minite lowering as the learner, returning the processed (post-temperature) FP32 log-probs.

Shape legend: B requests, L prompt length (padded), S_max cache slots, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..dynamo_guard import no_silent_eager_fallback
from ..recipe import NVFP4Recipe, as_recipe
from .decode_program import DecodeProgram, Sampling, pick_tokens
from .kv_cache import StaticKVCache
from .sampling import check_filter, request_keys
from .step import RolloutStep
from .weight_store import WeightStore
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

    Requests are padded up to a batch bucket (a power of two, at most max_batch; padded rows
    decode a one-token prompt and are dropped: rows never interact). Per bucket and sampling
    setting the engine builds one `DecodeProgram` (`decode_program.py`: model step, sampling,
    log-prob and bookkeeping of one token, driven by device-side state) with its KV cache, and
    keeps both across `generate` calls and `update_weights`. cuda_graphs=True (CUDA only): each
    program is captured once as a CUDA graph and every decode token is one replay (the same
    kernels on the same buffers, so the same bits).

    The quantized weights come from the engine's `WeightStore` (`weight_store.py`), rewritten in
    place by `update_weights`.
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

        self._programs: dict[tuple, DecodeProgram] = {}
        self._caches: dict[int, StaticKVCache] = {}
        self.programs_built = 0
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
        self._params = dict(self.model.named_parameters())
        self.weight_store = WeightStore(self._params)
        step = RolloutStep(self.model)
        if compile:
            options = {"recipe": self.recipe, "weight_store": self.weight_store}
            self.step = torch.compile(step, backend="minite", options=options)
        else:
            self.step = step

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
        self.weight_store = WeightStore(dict(module.named_parameters()))
        self.weight_store.bind_module(module)
        self.step = module
        self._params = {n.removeprefix("model."): p for n, p in module.named_parameters()}

    def update_weights(self, model) -> None:
        """Take the learner's new weights in place (no re-export) and re-quantize every weight
        of the weight store from them with the learner's quantizer (identical bytes), in place:
        the cached decode programs (and their CUDA graphs) read the new weights. Call it after
        every optimizer step, also when the engine shares the learner's module (the store holds
        the quantized bytes of the last update, whatever the version counters say)."""
        src = getattr(model, "_orig_mod", model)
        if src is not self.model:
            copy_learner_weights(self._params, src)
        elif self.model is not None:
            self.weight_store.check_unmoved(self.model)
        self.weight_store.refresh()

    def kv_cache_bytes(self, bucket: int) -> int:
        """Bytes of the static KV cache of one batch bucket (keys and values, every layer)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        per_layer = bucket * self.num_kv_heads * self.max_seq_len * self.head_dim * elem
        return 2 * self.num_layers * per_layer

    def _check_cache_fits(self, bucket: int) -> None:
        """Refuse, before any work, a cache the device cannot hold (naming the shape and the
        bytes it needs) instead of failing inside the allocator or the prefill."""
        if self.device.type != "cuda":
            return
        need = self.kv_cache_bytes(bucket)
        free, _total = torch.cuda.mem_get_info(self.device)
        if need > free:
            raise ValueError(
                f"the KV cache of batch {bucket} x max_seq_len {self.max_seq_len} "
                f"({self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim}, "
                f"{self.dtype}) needs {need / 2**30:.2f} GiB; {free / 2**30:.2f} GiB are free on "
                f"{self.device}: lower max_batch or max_seq_len"
            )

    def _cache(self, bucket: int) -> StaticKVCache:
        if bucket not in self._caches:
            self._check_cache_fits(bucket)
            self._caches[bucket] = StaticKVCache(
                num_layers=self.num_layers,
                batch=bucket,
                num_kv_heads=self.num_kv_heads,
                head_dim=self.head_dim,
                max_seq_len=self.max_seq_len,
                dtype=self.dtype,
                device=self.device,
            )
        return self._caches[bucket]

    def bucket(self, num: int) -> int:
        """The batch a generate call of `num` requests runs at: the next power of two, at most
        max_batch."""
        return min(1 << (num - 1).bit_length(), self.max_batch)

    def _program(self, bucket: int, sampling: Sampling) -> DecodeProgram:
        """The decode program of (bucket, sampling, cuda_graphs), built (and captured) once."""
        key = (bucket, sampling, self.cuda_graphs)
        if key not in self._programs:
            self._programs[key] = DecodeProgram(
                self._step, self._cache(bucket), batch=bucket, sampling=sampling,
                vocab_size=self.vocab_size, max_tokens=self.max_seq_len,
                capture=self.cuda_graphs,
            )  # fmt: skip
            self.programs_built += 1
        return self._programs[key]

    def _step(self, ids_BT, positions_BT, kv_len_B, cache: StaticKVCache):
        tensors = [t for pair in zip(cache.keys, cache.values) for t in pair]
        with no_silent_eager_fallback():
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
        if self.model is not None:
            self.weight_store.check_unmoved(self.model)
        sampling = Sampling(float(temperature)) if greedy else Sampling(
            float(temperature), int(top_k), float(top_p))  # fmt: skip
        bucket = self.bucket(num)
        ids = torch.zeros((bucket, width := int(lengths.max())), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        _check_token_ids(ids, self.vocab_size)
        program = self._program(bucket, sampling)  # before the prefill: a capture warms it
        # padded rows: a one-token prompt (token 0); rows never interact, so they change no bit
        lengths = torch.cat([lengths, torch.ones(bucket - num, dtype=torch.long)]).to(self.device)
        keys = request_keys(seeds + [0] * (bucket - num), self.device)
        positions = torch.arange(width).expand(bucket, width).contiguous().to(self.device)
        cache = self._cache(bucket)
        for t in (*cache.keys, *cache.values):  # as a fresh cache: no slot holds an old call's
            t.zero_()
        last = self._step(ids.to(self.device), positions, lengths, cache)[:, 0]  # [B, V]
        program.start(*pick_tokens(last, keys, 0, sampling, self.vocab_size), lengths, keys,
                      eos_token_id)  # fmt: skip
        # Every row runs every step (a finished request's later tokens are dropped below); no
        # host sync but the periodic all-finished check.
        steps = max_new_tokens
        for step in range(1, max_new_tokens):
            program()
            if eos_token_id is not None and step % _EOS_CHECK_EVERY == _EOS_CHECK_EVERY - 1:
                if bool(program.finished[:num].all()):
                    steps = step + 1
                    break
        tokens_all = program.tokens[:num, :steps].cpu()
        logps_all = program.logps[:num, :steps].cpu()
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
