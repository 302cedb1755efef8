"""The embedded rollout engine: continuously batched, seeded generation with a static KV cache,
through the same minite lowering as the learner, returning the processed (post-temperature) FP32
log-probs.

Shape legend: B requests, L prompt length (padded), S_max cache slots, V vocabulary.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import torch

from ..dynamo_guard import no_silent_eager_fallback
from ..engine_api import RolloutOutput, check_generate_args
from ..recipe import NVFP4Recipe, as_recipe
from .decode_program import DecodeProgram, Sampling, pick_tokens
from .export import RolloutArtifact, load_rollout
from .kv_cache import StaticKVCache
from .packed_weights import (
    check_not_learner,
    check_weights_option,
    held_weight_bytes,
    release_stored,
    update_packed,
)
from .paged_kv_cache import PageAllocator, PagedKVCache
from .paged_options import PagedOptions, check_kv_cache_options, paged_cache
from .sampling import request_keys
from .step import RolloutStep
from .weight_store import WeightStore
from .weight_sync import copy_learner_weights

# generate checks "has every request finished?" (a host sync) once per this many tokens
_EOS_CHECK_EVERY = 8


class RolloutEngine:
    """The embedded engine, one of the rollout engines of `fp4_compile.engine_api` (its
    `RolloutEngineProtocol`): engine = RolloutEngine(model, recipe=NVFP4Recipe.strict()); engine.generate(prompts, ...).

    `source` is a transformers causal LM (the learner's module, not a compiled wrapper). The
    engine compiles it with the `minite` backend and the SAME recipe as the learner, and runs
    prefill and decode through that lowering with a per-sequence static KV cache.

    A generate call takes any number of requests and runs them continuously batched in the rows
    (slots) of one batch bucket (a power of two, at most max_batch): a finished request's slot is
    refilled with the next waiting request (its prefill alone, into that slot's cache rows), and
    rows never interact, so every request's bits are those it has alone. Per bucket and sampling
    setting the engine builds one `DecodeProgram` (`decode_program.py`: model step, sampling,
    log-prob and bookkeeping of one token, driven by per-row device-side state) with its KV
    cache, and keeps both across `generate` calls and `update_weights`. cuda_graphs=True (CUDA
    only): each program is captured once as a CUDA graph and every decode token is one replay
    (the same kernels on the same buffers, so the same bits).

    The quantized weights come from the engine's `WeightStore` (`weight_store.py`), rewritten in
    place by `update_weights`. weights="bf16+packed" (the default) keeps the BF16 parameters
    too, and re-quantizes the store from them; weights="packed" keeps only what the step reads
    (`packed_weights.py`): once the store holds a weight (a model's engine: after its first
    generate's prefill; an artifact's: at construction) the BF16 storage of that parameter is
    released (shape kept, 0 bytes), and `update_weights` quantizes the learner's tensors straight
    into the store. The same bits either way; `weight_bytes()` says what the engine holds.
    Refused: compile=False, a recipe with quantize=False, and the learner's own module (build
    the engine on a copy).

    KV memory: kv_cache="static" (the default) holds [bucket, H_kv, max_seq_len, D] per layer
    per batch bucket. kv_cache="paged" sizes it in tokens (`paged_kv_cache.py`): one pool of
    pages of kv_page_size slots (a multiple of the attention's key block; default 64), shared
    by every bucket, of kv_tokens tokens or as many pages as kv_memory_bytes holds (give one).
    A request gets pages as it grows (at the host check every `_EOS_CHECK_EVERY` tokens, for
    the tokens up to the next one) and frees them when it finishes; a waiting request is
    admitted only when the free pages hold its prompt and those tokens; a running request that
    cannot grow preempts the youngest running request (its pages freed, itself requeued first:
    it restarts from its prompt with the same seed, so its bits are unchanged; never a silent
    truncation); a request that could not fit even alone is refused before any work, naming
    the setting. The attention reads the pages in place, in the same key blocks from key 0 as
    the static cache: every request's tokens and log-probs are the static cache's, bitwise.
    Model engines only (an exported artifact's step takes the static cache).
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
        weights: str = "bf16+packed",
        kv_cache: str = "static",
        kv_tokens: int | None = None,
        kv_memory_bytes: int | None = None,
        kv_page_size: int = 64,
    ):
        self._programs: dict[tuple, DecodeProgram] = {}
        self._caches: dict[int, StaticKVCache | PagedKVCache] = {}
        self._pool: PagedKVCache | None = None
        self.programs_built = 0
        self.decode_steps = 0  # decode program calls (one token for every row), all calls
        self.kv_preemptions = 0  # paged: requests restarted to free pages, all calls
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
        self.weights = check_weights_option(
            weights, compile=compile or self.model is None, recipe=self.recipe
        )
        if self.weights == "packed":
            if self.model is not None:
                check_not_learner(self.model)
            self._release_stored()  # an artifact's store is filled: bound at construction
        self.paged: PagedOptions | None = check_kv_cache_options(
            kv_cache,
            kv_tokens=kv_tokens,
            kv_memory_bytes=kv_memory_bytes,
            page_size=kv_page_size,
            device=self.device,
            from_artifact=self.model is None,
            bytes_per_token=self._kv_bytes_per_token(),
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
        self._module = self.model
        self.weight_store = WeightStore(self._params)
        if not self.recipe.quantize:  # BF16 q/k/v and gate/up: one buffer, one linear each
            self.weight_store.make_linear_groups()
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
        self._module = module

    def update_weights(self, model) -> None:
        """Take the learner's new weights in place (no re-export) and re-quantize every weight
        of the weight store from them with the learner's quantizer (identical bytes), in place:
        the cached decode programs (and their CUDA graphs) read the new weights. Call it after
        every optimizer step, also when the engine shares the learner's module (the store holds
        the quantized bytes of the last update, whatever the version counters say).
        weights="packed": the store is quantized from `model`'s tensors directly (each moved
        to the engine's device in turn, no BF16 copy kept); the engine's own module is refused."""
        src = getattr(model, "_orig_mod", model)
        if self.weights == "packed":
            if src is self.model:
                raise ValueError(
                    "update_weights: an engine with weights='packed' released its module's "
                    "quantized weights; give it the learner's module, not the engine's own"
                )
            update_packed(self._params, self.weight_store, src)
            return
        if src is not self.model:
            copy_learner_weights(self._params, src)
        elif self.model is not None:
            self.weight_store.check_unmoved(self.model)
        self.weight_store.refresh()

    def _release_stored(self) -> None:
        """weights="packed": release the storage of the parameters the store now holds (none
        that another name of the module ties to: the step may read it there)."""
        names = {}
        for name, p in self._module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        tied = {n for n, p in self.weight_store.params.items() if len(names.get(id(p), ())) > 1}
        release_stored(self.weight_store, keep=tied)

    def weight_bytes(self) -> int:
        """Bytes the engine holds for weights: the store's packed tensors and every parameter
        that still holds its storage (all of them with weights="bf16+packed")."""
        return held_weight_bytes(self._params, self.weight_store)

    def _kv_bytes_per_token(self) -> int:
        """Bytes one token's keys and values take (every layer)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def kv_cache_bytes(self, bucket: int) -> int:
        """Bytes of the static KV cache of one batch bucket (keys and values, every layer); with
        kv_cache="paged", of the one page pool (every bucket shares it; scratch page included)."""
        if self.paged is not None:
            return self.paged.num_pages * self.paged.page_size * self._kv_bytes_per_token()
        return bucket * self.max_seq_len * self._kv_bytes_per_token()

    def _check_cache_fits(self, bucket: int) -> None:
        """Refuse, before any work, a cache the device cannot hold (naming the shape and the
        bytes it needs) instead of failing inside the allocator or the prefill."""
        if self.device.type != "cuda":
            return
        need = self.kv_cache_bytes(bucket)
        free, _total = torch.cuda.mem_get_info(self.device)
        if need > free and self.paged is not None:
            raise ValueError(
                f"the paged KV cache ({self.paged.num_pages} pages of {self.paged.page_size} "
                f"tokens) needs {need / 2**30:.2f} GiB; {free / 2**30:.2f} GiB are free on "
                f"{self.device}: lower kv_tokens or kv_memory_bytes"
            )
        if need > free:
            raise ValueError(
                f"the KV cache of batch {bucket} x max_seq_len {self.max_seq_len} "
                f"({self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim}, "
                f"{self.dtype}) needs {need / 2**30:.2f} GiB; {free / 2**30:.2f} GiB are free on "
                f"{self.device}: lower max_batch or max_seq_len"
            )

    def _cache(self, bucket: int) -> StaticKVCache | PagedKVCache:
        if bucket in self._caches:
            return self._caches[bucket]
        if self.paged is not None:  # one pool for every bucket; a block table per bucket
            if self._pool is None:
                self._check_cache_fits(bucket)
                self._pool = paged_cache(self, self.paged, rows=bucket)
            self._caches[bucket] = paged_cache(self, self.paged, rows=bucket, pool=self._pool)
        else:
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
                self._step,
                self._cache(bucket),
                batch=bucket,
                sampling=sampling,
                vocab_size=self.vocab_size,
                max_tokens=self.max_seq_len,
                capture=self.cuda_graphs,
            )
            self.programs_built += 1
        return self._programs[key]

    def _step(self, ids_BT, positions_BT, kv_len_B, cache: StaticKVCache, rows=None):
        """The compiled step on `cache`, or (rows = slice) on those rows of it: views of each
        layer's K/V rows, written in place (a prefill into the slots of a running bucket)."""
        tensors = [t for pair in zip(cache.keys, cache.values) for t in pair]
        if isinstance(cache, PagedKVCache):  # the pools whole, the rows' block table
            table = cache.block_table if rows is None else cache.block_table[rows]
            with no_silent_eager_fallback():
                return self.step(ids_BT, positions_BT, kv_len_B, *tensors, block_table=table)
        if rows is not None:
            tensors = [t[rows] for t in tensors]
        with no_silent_eager_fallback():
            return self.step(ids_BT, positions_BT, kv_len_B, *tensors)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int | list[int],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | list[int] = 0,
        eos_token_id: int | None = None,
    ) -> RolloutOutput:
        """Generate for token-id prompts of different lengths, any number of them. `seed` is one
        int (request i uses seed + i) or one seed per request; a request's samples depend only on
        its own seed. `max_new_tokens`: one budget for every request or one per request.

        Continuous batching: up to max_batch requests run at once in the rows (slots) of one
        batch bucket; when a request finishes (EOS or its budget), the next waiting one is
        prefilled into its slot (alone, batch 1, into that slot's cache rows) and joins the next
        decode step. Rows never interact and a request's token t always draws the noise of (its
        seed, t), so its tokens and log-probs are bitwise the same alone, in a full batch or
        admitted mid-flight. The host reads the finished flags only every few tokens (and when a
        budget ends a request).

        temperature=0 decodes greedily (argmax of the logits, ties to the lower token id; top_k,
        top_p and the seeds are then unused), and the returned log-probs are those of the
        unscaled logits: `sequence_logprobs(..., temperature=1.0)` reproduces them."""
        args = check_generate_args(
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            vocab_size=self.vocab_size,
            max_seq_len=self.max_seq_len,
        )
        num, budgets, seeds, greedy = len(prompts), args.budgets, args.seeds, args.greedy
        if self.model is not None:
            self.weight_store.check_unmoved(self.model)
        sampling = (
            Sampling(float(temperature))
            if greedy
            else Sampling(float(temperature), int(top_k), float(top_p))
        )
        bucket = self.bucket(min(num, self.max_batch))
        program = self._program(bucket, sampling)  # before the prefill: a capture warms it
        cache = self._cache(bucket)
        keys = request_keys(seeds, self.device)
        pages = None
        if self.paged is not None:  # pages are handed out afresh; stale ones are never visible
            pages = PageAllocator(cache)
            self.paged.check_requests(prompts, budgets, pages)
        else:
            for t in (*cache.keys, *cache.values):  # a fresh cache: no slot holds an old call's
                t.zero_()
        program.start(eos_token_id)
        run = _Slots(self, program, cache, prompts, budgets, keys, sampling, pages)
        run.prefill_first(min(num, bucket))
        if self.weights == "packed":  # the first compile filled the store
            self._release_stored()
        # Every running row runs every step; a finished row idles (frozen) until refilled. The
        # host syncs at the next budget's end, and with an EOS id every _EOS_CHECK_EVERY tokens.
        while run.running():
            todo = run.steps_to_next_end()
            if eos_token_id is not None or pages is not None:
                todo = min(todo, _EOS_CHECK_EVERY)
            run.reserve(todo)  # paged: every running row's pages for these tokens
            for _ in range(todo):
                program()
            run.steps += todo
            self.decode_steps += todo
            run.harvest_and_refill()
        reasons = [
            "eos" if eos_token_id is not None and toks and toks[-1] == eos_token_id else "length"
            for toks in run.tokens
        ]
        return RolloutOutput(tokens=run.tokens, logprobs=run.logprobs, finish_reasons=reasons)


class _Slots:
    """The host side of one continuously batched generate call: which request runs in which row
    (slot) of the bucket, when each one's budget ends, the waiting queue, the finished results;
    with a paged cache (`pages`, a `PageAllocator`), each row's pages."""

    def __init__(self, engine, program, cache, prompts, budgets, keys, sampling, pages=None):
        self.engine, self.program, self.cache = engine, program, cache
        self.prompts, self.budgets, self.keys, self.sampling = prompts, budgets, keys, sampling
        self.pages = pages
        self.request = [None] * program.batch  # the request index each slot runs, or None
        self.ends = [0] * program.batch  # the decode step after which its budget is spent
        self.admitted = [0] * program.batch  # the decode step its request was admitted at
        self.waiting = deque(range(len(prompts)))
        self.steps = 0  # decode steps run so far
        self.tokens: list = [None] * len(prompts)
        self.logprobs: list = [None] * len(prompts)

    def running(self) -> bool:
        if any(r is not None for r in self.request):
            return True
        assert not self.waiting, "a request waits with every slot idle (checked up front)"
        return False

    def steps_to_next_end(self) -> int:
        return min(self.ends[s] for s, r in enumerate(self.request) if r is not None) - self.steps

    def _admit(self, slots, requests, first, first_logp) -> None:
        device = self.engine.device
        lengths = torch.tensor([len(self.prompts[i]) for i in requests], device=device)
        budgets = [self.budgets[i] for i in requests]
        self.program.admit(
            torch.tensor(slots, device=device),
            first,
            first_logp,
            lengths,
            self.keys[list(requests)],
            torch.tensor(budgets, device=device),
        )
        for s, i, b in zip(slots, requests, budgets):
            self.request[s], self.ends[s], self.admitted[s] = i, self.steps + b - 1, self.steps

    def _tokens(self, i: int, ahead: int) -> int:
        """Positions request i (admitted now, or `ahead` decode steps from its admission) writes:
        its prompt, then one per decode step, at most budget - 1 of them."""
        return len(self.prompts[i]) + min(ahead, self.budgets[i] - 1)

    def _next_fits(self, slot: int) -> bool:
        """Paged: whether the next waiting request gets its pages in `slot` (for its prompt and
        the tokens to the next host check), taking them if so. Static: always."""
        if self.pages is None:
            return True
        tokens = self._tokens(self.waiting[0], _EOS_CHECK_EVERY)
        if not self.pages.can_grow(slot, tokens):
            return False
        self.pages.grow(slot, tokens)
        return True

    def _take_waiting(self, slots) -> list[tuple[int, int]]:
        """(slot, request) pairs for the free `slots`, in queue order, while the pages last."""
        pairs = []
        for s in slots:
            if not self.waiting or not self._next_fits(s):
                break
            pairs.append((s, self.waiting.popleft()))
        if self.pages is not None:
            self.pages.flush()
        return pairs

    def reserve(self, todo: int) -> None:
        """Paged: pages for every running row's next `todo` decode steps, oldest request first;
        a row that cannot grow preempts the youngest running request (perhaps itself): its
        pages are freed, its row idles, and it goes back to the front of the queue (it restarts
        from its prompt with the same seed: the same bits)."""
        if self.pages is None:
            return
        for s in sorted(self._running_slots(), key=lambda s: self.admitted[s]):
            if self.request[s] is None:  # preempted while making room for an older row
                continue
            tokens = self._tokens(self.request[s], self.steps + todo - self.admitted[s])
            while not self.pages.can_grow(s, tokens):
                self._preempt(max(self._running_slots(), key=lambda r: (self.admitted[r], r)))
                if self.request[s] is None:
                    break
            else:
                self.pages.grow(s, tokens)
        self.pages.flush()

    def _running_slots(self) -> list[int]:
        return [s for s, r in enumerate(self.request) if r is not None]

    def _preempt(self, slot: int) -> None:
        self.program.finished[slot] = True
        self.waiting.appendleft(self.request[slot])
        self.request[slot] = None
        self.pages.release(slot)
        self.engine.kv_preemptions += 1

    def prefill_first(self, count: int) -> None:
        """Requests 0..count-1 into slots 0..count-1, one batched prefill (padded rows: a
        one-token prompt; rows never interact, so they change no bit, and stay idle). Paged: as
        many of them as the pages hold."""
        engine, bucket = self.engine, self.program.batch
        requests = [i for _, i in self._take_waiting(range(count))]
        count = len(requests)
        width = max(len(self.prompts[i]) for i in requests)
        ids = torch.zeros((bucket, width), dtype=torch.long)
        lengths = torch.ones(bucket, dtype=torch.long)
        for s, i in enumerate(requests):
            ids[s, : len(self.prompts[i])] = torch.tensor(self.prompts[i], dtype=torch.long)
            lengths[s] = len(self.prompts[i])
        positions = torch.arange(width).expand(bucket, width).contiguous()
        last = engine._step(
            ids.to(engine.device),
            positions.to(engine.device),
            lengths.to(engine.device),
            self.cache,
        )[:count, 0]
        first = pick_tokens(last, self.keys[:count], 0, self.sampling, engine.vocab_size)
        self._admit(list(range(count)), requests, *first)

    def _prefill_into(self, slots) -> None:
        """The next waiting requests into `slots` (free rows of the running bucket): each
        prefilled alone (batch 1) into its slot's cache rows, then all admitted at once."""
        engine, device = self.engine, self.engine.device
        pairs = self._take_waiting(slots)
        if not pairs:
            return
        firsts, logps = [], []
        for s, i in pairs:
            prompt = torch.tensor([self.prompts[i]], dtype=torch.long, device=device)
            width = prompt.shape[1]
            positions = torch.arange(width, device=device)[None]
            length = torch.tensor([width], device=device)
            last = engine._step(prompt, positions, length, self.cache, rows=slice(s, s + 1))
            picked, logp = pick_tokens(
                last[:, 0], self.keys[i : i + 1], 0, self.sampling, engine.vocab_size
            )
            firsts.append(picked)
            logps.append(logp)
        slots, requests = zip(*pairs)
        self._admit(list(slots), list(requests), torch.cat(firsts), torch.cat(logps))

    def harvest_and_refill(self) -> None:
        """Read the finished flags and counts (one host sync); collect the finished requests'
        tokens and log-probs; refill their slots from the waiting queue."""
        program = self.program
        state = torch.stack((program.finished.to(torch.int64), program.n)).cpu()
        done = [s for s, r in enumerate(self.request) if r is not None and bool(state[0, s])]
        if not done:
            if self.pages is not None and self.waiting:  # slots a preemption or a full pool left
                self._prefill_into([s for s, r in enumerate(self.request) if r is None])
            return
        counts = [int(state[1, s]) for s in done]
        rows = torch.tensor(done, device=program.n.device)
        width = max(counts)
        tokens = program.tokens[rows, :width].cpu()
        logps = program.logps[rows, :width].cpu()
        for j, (s, count) in enumerate(zip(done, counts)):
            i = self.request[s]
            self.tokens[i] = tokens[j, :count].tolist()
            self.logprobs[i] = logps[j, :count].clone()
            self.request[s] = None
            if self.pages is not None:
                self.pages.release(s)
        if self.pages is not None:  # also the slots a full pool left idle before
            done = [s for s, r in enumerate(self.request) if r is None]
        self._prefill_into(done)
