"""TRL's GRPOTrainer with minite's numerics on both sides: `MiniteGRPOTrainer`.

    trainer = MiniteGRPOTrainer(model, reward_funcs=..., args=GRPOConfig(bf16=False, ...),
                                train_dataset=..., processing_class=tokenizer, recipe="strict")
    trainer.train()

What it changes in TRL 1.16's GRPOTrainer: its `rollout_func` argument, a callback, `log`, and
two of its underscore methods (`_get_per_token_logps_and_entropies`,
`_generate_and_score_completions`: not public API, hence the version pin):
- rollouts: `rollout_func` (TRL's hook for custom generation) runs minite's `RolloutEngine` on
  the tokenized prompts, with TRL's sampling settings (temperature, top_k, top_p,
  max_completion_length), and returns the engine's per-token log-probs. The engine holds its own
  copy of the weights and takes the learner's after every optimizer step
  (`engine.update_weights`, from a callback's `on_optimizer_step`).
- the learner: `_get_per_token_logps_and_entropies`, TRL's one place where the trainer computes
  per-token log-probs (old, reference and the loss's), runs the model compiled with the `minite`
  backend and the user's recipe, on rows re-packed to start at position 0 (TRL left-pads prompts
  and passes no position ids; the engine puts every prompt at positions 0..p-1) and right-padded
  to the micro-batch's longest sequence rounded up to a width bucket (`fp4_compile.learner_widths`:
  at most 8 widths, so at most 8 compiled shapes; no work past the longest sequence), then
  minite's log-prob op at TRL's temperature. So the learner's log-probs equal the rollout's bit
  for bit under a strict recipe. The learner and the frozen reference are compiled with
  `fp4_compile.compile(..., quantize_weights="on_change")`: each NVFP4 weight is quantized once
  per optimizer step (the reference: once), not in every call (TRL calls the learner for the
  mismatch metrics and for every gradient-accumulation micro-batch); the same bits.
- metrics: after each generation the learner's log-probs of the generated tokens (no gradient,
  the weights that sampled them) are compared with the engine's and logged under TRL's names,
  `sampling/sampling_logp_difference/{mean,max}` and `sampling/importance_sampling_ratio/
  {min,mean,max}` (TRL logs them only with vLLM), and under minite's (`fp4_compile.rl.diagnostics.mismatch`:
  `mismatch/max_abs_dlogp`, `mismatch/frac_bitwise_equal`, `rollout_corr/*`, ...).

Refused, with the setting named (`check_args`, `check_dropout`): what breaks the bits (bf16 /
fp16 autocast, an FP32-cast LM head, Liger kernels, dropout in the learner, a temperature of 0,
sampling options the engine does not apply) and what this integration does not run (vLLM or
transformers generation, a user `rollout_func`, tools and environments, PEFT, vision-language
processors, several processes).

Shape legend: B rows, P prompt columns (TRL's left-padded block), C completion columns
(`logits_to_keep`), W the full width (max_prompt_length + max_completion_length), W' <= W a
micro-batch's learner width, V vocabulary.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import torch

from fp4_compile.rl.diagnostics.mismatch import mismatch_metrics

from ..codegen import logprobs as shared_logprobs
from ..compile_api import compile as compile_model
from ..dynamo_guard import no_silent_eager_fallback
from ..engine_api import RolloutEngineProtocol
from ..learner_widths import learner_width
from ..recipe import NVFP4Recipe, as_recipe
from ..rollout import RolloutEngine
from ..seeds import derive_seed

try:
    from transformers import ProcessorMixin, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:  # pragma: no cover - the message names the extra
    raise ImportError("fp4_compile.integrations.trl needs TRL: pip install 'minite[trl]'") from e

TESTED_TRL = "1.16"

# TRL sampling-metric names (trl/trainer/grpo_trainer.py logs them in vLLM mode)
TRL_METRIC_NAMES = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


def check_args(args: GRPOConfig) -> None:
    """Refuse, naming the setting, what would break learner == rollout or is not run here."""
    if args.bf16 or args.fp16:
        raise ValueError(
            f"GRPOConfig(bf16={args.bf16}, fp16={args.fp16}): autocast recasts the learner's "
            "activations, so its log-probs stop matching the rollout's bit for bit; minite's recipe "
            "decides the precision. Pass bf16=False (TRL's default is True) and fp16=False."
        )
    if not args.temperature > 0:
        raise ValueError(
            f"GRPOConfig(temperature={args.temperature}): the learner computes log-probs of "
            "logits / temperature, so temperature must be > 0 (greedy rollouts have no GRPO group)"
        )
    refused = {
        "cast_lm_head_to_fp32": (
            args.cast_lm_head_to_fp32,
            "it replaces the LM head's forward, so the learner's logits leave minite's lowering",
        ),
        "use_liger_kernel": (args.use_liger_kernel, "Liger's kernels replace minite's lowering"),
        "use_vllm": (
            args.use_vllm,
            "rollouts come from minite's RolloutEngine (vLLM with minite's plugin: docs/vllm.md)",
        ),
        "use_transformers_continuous_batching": (
            args.use_transformers_continuous_batching,
            "rollouts come from minite's RolloutEngine",
        ),
        "torch_compile": (
            args.torch_compile,
            "the trainer compiles the learner with minite itself",
        ),
        "sync_ref_model": (args.sync_ref_model, "not supported by this integration yet"),
    }
    for name, (value, why) in refused.items():
        if value:
            raise ValueError(f"GRPOConfig({name}={getattr(args, name)!r}) is refused: {why}")
    if args.min_p not in (None, 0.0):
        raise ValueError(f"GRPOConfig(min_p={args.min_p}): minite's engine has no min-p filter")
    if args.repetition_penalty != 1.0:
        raise ValueError(
            f"GRPOConfig(repetition_penalty={args.repetition_penalty}): minite's engine samples "
            "from logits / temperature with top-k / top-p only"
        )
    if args.generation_kwargs:
        raise ValueError(
            f"GRPOConfig(generation_kwargs={args.generation_kwargs!r}): the engine takes TRL's "
            "temperature, top_k, top_p and max_completion_length only"
        )
    if args.max_completion_length is None or args.max_completion_length < 1:
        raise ValueError(
            f"GRPOConfig(max_completion_length={args.max_completion_length}) must be >= 1"
        )
    if args.world_size > 1:
        raise ValueError(
            f"{args.world_size} processes: this integration runs in one process (the learner is "
            "called unwrapped, which would skip DDP's gradient all-reduce)"
        )


def check_dropout(model: torch.nn.Module, args: GRPOConfig) -> None:
    """The learner trains in train mode and the engine samples without dropout: refuse a model
    whose forward would drop anything (TRL's disable_dropout zeroes the Dropout modules only,
    not a config's attention dropout)."""
    cfg = model.config.get_text_config() if hasattr(model, "config") else None
    attention_dropout = float(getattr(cfg, "attention_dropout", 0.0) or 0.0)
    if attention_dropout > 0:
        raise ValueError(
            f"model.config.attention_dropout={attention_dropout}: dropout in the learner's "
            "forward changes its log-probs; set it to 0.0"
        )
    has_dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    if has_dropout and not args.disable_dropout:
        raise ValueError(
            "GRPOConfig(disable_dropout=False) with a model that has dropout: dropout in the "
            "learner's forward changes its log-probs; pass disable_dropout=True"
        )


class _EngineWeightSync(TrainerCallback):
    """After every optimizer step the engine takes the learner's weights, in place."""

    def __init__(self, engine: RolloutEngineProtocol, model: torch.nn.Module):
        self.engine, self.model = engine, model

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.engine.update_weights(self.model)


class MiniteGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose rollouts come from minite's `RolloutEngine` and whose learner runs the
    `minite` backend under `recipe`, so the learner's per-token log-probs equal the rollout's
    bit for bit (strict recipe). Arguments are GRPOTrainer's, plus:

    recipe: the NVFP4 recipe of learner AND engine (an `NVFP4Recipe`, its dict, a preset name).
    max_prompt_length: the longest tokenized prompt accepted; with `max_completion_length` it
        sets the engine's KV-cache length and the learner's full width W (a learner micro-batch
        is right-padded to the width bucket of its longest sequence, at most W).
    device: where the engine runs (default: the model's device).
    engine_weights: the engine's weight copy (`RolloutEngine(weights=...)`, the same bits either
        way): "bf16+packed" (default) or "packed" (only what its compiled step reads: the NVFP4
        store and the BF16 weights the recipe leaves unquantized).

    `model` must be an instantiated causal LM (its weights are copied into the engine and, for
    beta != 0, into a frozen reference that gets its own compiled copy).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        reward_funcs=None,
        args: GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        *,
        recipe: NVFP4Recipe | dict | str | None = None,
        max_prompt_length: int = 512,
        device=None,
        engine_weights: str = "bf16+packed",
        **trl_kwargs,
    ):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"model must be an instantiated causal LM module, got {type(model).__name__}"
            )
        if args is None:
            raise ValueError(
                "args: pass a GRPOConfig (with bf16=False: TRL's default bf16=True is refused)"
            )
        check_args(args)
        for name in ("rollout_func", "tools", "environment_factory", "peft_config"):
            if trl_kwargs.get(name):
                raise ValueError(
                    f"{name} is refused: the integration owns generation and the learner"
                )
        if getattr(model, "peft_config", None):
            raise ValueError(
                "model: PEFT models are refused (the adapters are not lowered by minite)"
            )
        check_dropout(model, args)
        if isinstance(processing_class, ProcessorMixin):
            raise ValueError("processing_class: vision-language processors are refused")
        if not isinstance(max_prompt_length, int) or max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be a positive int, got {max_prompt_length!r}")
        self.recipe = as_recipe(recipe)
        self.max_prompt_length = max_prompt_length
        self.learner_width = max_prompt_length + args.max_completion_length
        self._num_rollouts = 0
        self._mismatch_logs: dict[str, dict[str, list[float]]] = {
            "train": defaultdict(list),
            "eval": defaultdict(list),
        }
        # The engine owns its own copy of the weights, taken before TRL patches the model; in
        # eval mode (no dropout), as check_dropout and TRL's disable_dropout make the learner.
        self.engine = RolloutEngine(
            copy.deepcopy(model).eval(),
            recipe=self.recipe,
            device=device,
            max_batch=max(args.generation_batch_size, args.per_device_eval_batch_size),
            max_seq_len=self.learner_width,
            weights=engine_weights,
        )
        reference = copy.deepcopy(model).requires_grad_(False).eval() if args.beta != 0 else None
        # TRL would build the reference by loading the model's hub path again; minite brings its
        # own (the initial weights), so TRL sees beta = 0 while it is constructed.
        beta = args.beta
        args.beta = 0.0
        try:
            super().__init__(
                model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                rollout_func=self._minite_rollout,
                **trl_kwargs,
            )
        finally:
            args.beta = beta
        self.beta = beta
        if reference is not None:
            self.ref_model = self.accelerator.prepare_model(reference, evaluation_mode=True)
        # weights quantized once per version (`fp4_compile.compile`'s on_change): TRL calls the
        # learner several times per optimizer step (the mismatch metrics' no-grad pass, every
        # gradient-accumulation micro-batch) and the frozen reference never changes
        self.learner = compile_model(
            self.model, recipe=self.recipe, quantize_weights="on_change", dynamic=False
        )
        self.ref_learner = None
        if self.ref_model is not None:
            self.ref_learner = compile_model(
                self.ref_model, recipe=self.recipe, quantize_weights="on_change", dynamic=False
            )
        self.add_callback(_EngineWeightSync(self.engine, self.model))

    # ---- rollouts ------------------------------------------------------------------------
    def _tokenize(self, prompts: list) -> list[list[int]]:
        """TRL's prompt rendering, through the tokenizer's public API: conversations through the
        chat template (with a generation prompt and `chat_template_kwargs`), text as it is."""
        tok = self.processing_class
        if isinstance(prompts[0], list):
            out = tok.apply_chat_template(
                prompts,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                **self.chat_template_kwargs,
            )["input_ids"]
        else:
            out = tok(text=prompts)["input_ids"]
        return [list(ids) for ids in out]

    def _minite_rollout(self, prompts: list, trainer) -> dict:
        """TRL's `rollout_func`: one completion per prompt (TRL repeats each prompt
        `num_generations` times), sampled by minite's engine with TRL's settings."""
        prompt_ids = self._tokenize(prompts)
        for i, ids in enumerate(prompt_ids):
            if len(ids) > self.max_prompt_length:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens, more than max_prompt_length="
                    f"{self.max_prompt_length} (a MiniteGRPOTrainer argument)"
                )
        call = self._num_rollouts
        self._num_rollouts += 1
        seeds = [derive_seed(self.args.seed, "trl-rollout", call, i) for i in range(len(prompts))]
        eos_ids = list(self.eos_token_ids)
        out = self.engine.generate(
            prompt_ids,
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_k=self.top_k or 0,
            top_p=self.top_p,
            seed=seeds,
            eos_token_id=eos_ids[0] if eos_ids else None,
        )
        completion_ids, logprobs = [], []
        for tokens, logps in zip(out.tokens, out.logprobs):
            # the engine stops at one EOS id; a completion also ends at the model's other EOS ids
            end = next((j + 1 for j, t in enumerate(tokens) if t in eos_ids), len(tokens))
            completion_ids.append(tokens[:end])
            logprobs.append(logps[:end].tolist())  # FP32 -> float -> FP32 is exact
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    # ---- the learner ---------------------------------------------------------------------
    def _pack(self, input_ids_BL, attention_mask_BL, logits_to_keep: int):
        """TRL's rows (prompt left-padded in P columns, completion right-padded in C) -> rows
        that start at position 0, right-padded to W' (the width bucket of the longest row); for
        each completion column, its target index in the [B, W' - 1] log-prob grid and whether
        it is a real token; [B, W'] real."""
        num_rows, width_in = input_ids_BL.shape
        prompt_cols = width_in - logits_to_keep
        mask = attention_mask_BL.bool()
        p_B = mask[:, :prompt_cols].sum(1)
        c_B = mask[:, prompt_cols:].sum(1)
        cols = torch.arange(width_in, device=mask.device)
        contiguous = (cols >= prompt_cols - p_B[:, None]) & (cols < prompt_cols + c_B[:, None])
        if not bool(torch.equal(contiguous, mask)):
            raise ValueError(
                "attention_mask: each row must be one left-padded prompt followed by one "
                "right-padded completion (no masked tokens inside a sequence)"
            )
        n_B = p_B + c_B
        if int(n_B.max()) > self.learner_width:
            raise ValueError(
                f"a sequence of {int(n_B.max())} tokens exceeds the learner width "
                f"{self.learner_width} (max_prompt_length + max_completion_length)"
            )
        width = learner_width(int(n_B.max()), self.learner_width)
        t = torch.arange(width, device=mask.device)
        src = (prompt_cols - p_B[:, None] + t).clamp(max=width_in - 1)
        ids_BW = torch.where(
            t < n_B[:, None],
            input_ids_BL.gather(1, src),
            torch.full_like(src, self.processing_class.pad_token_id),
        )
        j = torch.arange(logits_to_keep, device=mask.device)
        target_BC = (p_B[:, None] - 1 + j).clamp(min=0, max=width - 2)
        real_BC = j < c_B[:, None]
        return ids_BW, target_BC, real_BC, t < n_B[:, None]

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """TRL's per-token log-probs (old, reference and the loss's), computed by minite: the
        compiled learner over re-packed rows, then minite's log-prob op at TRL's temperature.
        -> (logps [B, C], entropies [B, C] or None, the MoE load-balancing loss or None)."""
        if any(v is not None for v in multimodal.values()):
            raise ValueError("multimodal inputs are refused by MiniteGRPOTrainer")
        inner = self.accelerator.unwrap_model(model)
        if inner is self.accelerator.unwrap_model(self.model):
            compiled = self.learner
        elif self.ref_model is not None and inner is self.accelerator.unwrap_model(self.ref_model):
            compiled = self.ref_learner
        else:
            raise ValueError(
                f"model: neither the policy nor the reference ({type(inner).__name__})"
            )
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies, all_aux = [], [], []
        router = {"output_router_logits": True} if compute_aux_loss else {}
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            ids_BW, target_BC, real_BC, real_BW = self._pack(
                input_ids[rows], attention_mask[rows], logits_to_keep
            )
            with no_silent_eager_fallback():
                out = compiled(input_ids=ids_BW, use_cache=False, **router)
            logits = out.logits
            if compute_aux_loss:
                all_aux.append(self._load_balancing_loss(out.router_logits, real_BW))
            logp, entropy = shared_logprobs(logits[:, :-1], ids_BW[:, 1:], self.temperature)
            zero = logp.new_zeros(())
            all_logps.append(torch.where(real_BC, logp.gather(1, target_BC), zero))
            if compute_entropy:
                all_entropies.append(torch.where(real_BC, entropy.gather(1, target_BC), zero))
        logps = torch.cat(all_logps)
        entropies = torch.cat(all_entropies) if compute_entropy else None
        aux_loss = torch.stack(all_aux).mean() if compute_aux_loss else None
        return logps, entropies, aux_loss

    def _load_balancing_loss(self, router_logits, real_BW):
        """The MoE load-balancing loss TRL adds (`router_aux_loss_coef`), over the real tokens
        only (the model's own aux loss would count the right padding)."""
        # lazy: transformers is optional (the hf extra)
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

        cfg = self.model.config.get_text_config()
        num_experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
        return load_balancing_loss_func(
            router_logits, num_experts, cfg.num_experts_per_tok, real_BW.long()
        )

    # ---- mismatch metrics ----------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self._log_mismatch(output)
        return output

    @torch.no_grad()
    def _log_mismatch(self, output: dict) -> None:
        """Learner vs rollout log-probs of the tokens just generated (same weights), under
        TRL's and minite's metric names."""
        mode = "train" if self.model.training else "eval"
        mask = output["completion_mask"]
        rollout = output["sampling_per_token_logps"]
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attn = torch.cat([output["prompt_mask"], mask], dim=1)
        learner = self._get_per_token_logps_and_entropies(
            self.model, ids, attn, mask.size(1), batch_size=self.args.per_device_train_batch_size
        )[0]
        real = mask.bool()
        delta = (learner - rollout).abs()[real]
        ratio = torch.exp(learner - rollout)[real]
        if delta.numel() == 0:
            delta = ratio = torch.zeros(1, device=mask.device)
        trl_values = torch.stack(
            [delta.mean(), delta.max(), ratio.min(), ratio.mean(), ratio.max()]
        ).tolist()
        metrics = dict(zip(TRL_METRIC_NAMES, trl_values))
        metrics.update(mismatch_metrics(learner.float(), rollout.float(), mask.float()))
        for name, value in metrics.items():
            self._mismatch_logs[mode][name].append(value)
        self.last_mismatch = {"learner": learner, "rollout": rollout, "mask": mask}

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's `log`, with the mismatch metrics since the last log (averaged; max for the
        maxima, min for the minima) added to `logs`."""
        mode = "train" if self.model.training else "eval"
        prefix = "" if mode == "train" else "eval_"
        for name, values in self._mismatch_logs[mode].items():
            if name.endswith(("/max", "_max")) or name == "mismatch/max_abs_dlogp":
                value = max(values)
            elif name.endswith("/min"):
                value = min(values)
            else:
                value = sum(values) / len(values)
            logs[prefix + name] = value
        self._mismatch_logs[mode].clear()
        super().log(logs, start_time)
