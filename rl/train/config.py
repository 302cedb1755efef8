"""`TrainConfig`: every setting of a GRPO run in one frozen dataclass (the named presets in
`rl/train/presets.py` fill it in; `key=value` on the command line replaces single fields)."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ...model_dir import check_model_dir
from ...recipe import NVFP4Recipe
from ...rollout.packed_weights import WEIGHT_FORMS
from ...seeds import derive_seed as derive_seed  # re-exported: the run's seed streams
from ..tasks.builtin import TASK_NAMES
from .engines import engine_entry
from .grpo import ADVANTAGE_SCALES, AGGREGATIONS

VARIANTS = ("strict", "te", "bf16")
ARCHS = ("qwen3", "qwen3_moe")
# Fields that may change between a run and its resumption (they do not change the numbers of
# the steps already taken or to come).
RESUMABLE_FIELDS = (
    "steps",
    "checkpoint_every",
    "keep_checkpoints",
    "out_dir",
    "cache_dir",
    "log_every",
    "eval_every",
    "eval_size",
    "rollout_weights",  # where the engine's weights live, not what they compute
    "rollout_kv_tokens",  # where the engine's KV cache lives, not what it computes
)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    name: str = "custom"
    """Recipe name (for logs and the summary)."""
    variant: str = "strict"
    """Numerics: "strict" (NVFP4, batch-invariant, learner == rollout bitwise), "te" (NVFP4 with
    per-tensor activation scales, corrected by token TIS), "bf16" (no quantization)."""

    # ---- model --------------------------------------------------------------------------
    model: str = ""
    """A local transformers causal-LM checkpoint directory (config.json, weights, tokenizer) to
    train instead of a random-init model: loaded with `AutoModelForCausalLM.from_pretrained`
    (FP32 master weights, SDPA attention), its own tokenizer and chat template build the
    prompts, and the architecture fields below (arch ... moe_intermediate) are ignored. The
    warm start still runs as configured (teacher-forced through the checkpoint's tokenizer);
    warm_start_steps=0 starts GRPO from the checkpoint as it is. "" = random init."""
    # random init (model=""): a transformers Qwen3 / Qwen3-MoE built from these fields
    arch: str = "qwen3"
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 128
    experts: int = 4
    """Qwen3-MoE only: routed experts per layer."""
    experts_per_token: int = 2
    moe_intermediate: int = 32
    bf16_modules: tuple[str, ...] = ()
    """fnmatch patterns of module paths whose GEMMs stay BF16, added to the recipe's own
    (embeddings, lm_head, MoE router: `NVFP4Recipe.bf16_modules`). A GEMM whose K or N is not a
    multiple of 16 cannot be NVFP4, and the strict variant refuses it before any work unless a
    pattern names it. On the command line: comma-separated, e.g.
    `bf16_modules=*model.layers.*.self_attn.*,*model.layers.*.mlp.*`."""

    # ---- task ----------------------------------------------------------------------------
    task: str = "addition"
    """"addition", "sort", "mix" (built in, rl/tasks/builtin.py) or a reasoning-gym family "rg:<name>"
    (rl/tasks/reasoning_gym.py; needs the extra `minite[tasks]`)."""
    system_prompt: str | None = None
    """The system turn before every prompt, where prompts go through a chat template (a
    `model=DIR` checkpoint whose tokenizer has one): the chat is [system, user], rendered with
    `add_generation_prompt=True`. None = the task's own: the reasoning-gym families ask the model
    to think, then answer inside <answer></answer> (rl/tasks/reasoning_gym.py SYSTEM_PROMPT); the built-in
    tasks have none. "" = no system turn. Without a chat template (the built-in character
    tokenizer, or a checkpoint without one) prompts are the question alone: None and "" then
    mean the same and any other text is refused."""
    num_digits: int = 2
    """Operand digits of the built-in tasks (the rg: families pin their own sizes)."""
    partial_credit: float = 0.0
    """Reward for a wrong answer = partial_credit x fraction of right characters."""

    # ---- rollout -------------------------------------------------------------------------
    prompts_per_step: int = 16
    group_size: int = 8
    """Samples per prompt (the GRPO group)."""
    temperature: float = 1.0
    max_new_tokens: int = 0
    """The response budget: tokens the rollout may generate per sequence, each sequence stopping
    at its own EOS. 0 = the task's longest answer with its EOS (`token_budget`), room for a model
    that answers at once; a model that reasons first needs more. The learner's batch is only as
    wide as its longest real sequence (rl/train/batching.py), so an unused budget costs no learner
    work. TRL: max_completion_length; verl: data.max_response_length (docs/settings.md)."""

    # ---- GRPO ----------------------------------------------------------------------------
    steps: int = 40
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Max global grad norm (0 disables clipping; the norm is logged either way)."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: str = "token"
    advantage_scale: str = "std"
    updates_per_batch: int = 1
    """Optimizer steps on each rollout batch (1 = on-policy; >1 makes the clip matter)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the reference policy (the warm-started model); 0 builds no ref."""
    tis_cap: float | None = None
    """Token-level truncated IS cap C (None: off). The `te` variant sets 2."""
    mis_token_bounds: tuple[float, float] | None = None
    mis_seq_bounds: tuple[float, float] | None = None

    # ---- warm start ----------------------------------------------------------------------
    warm_start_steps: int = 200
    warm_start_lr: float = 3e-3
    warm_start_batch: int = 64

    # ---- held-out evaluation ---------------------------------------------------------------
    eval_every: int = 10
    """Greedy evaluation on the held-out set before GRPO (step 0), every `eval_every` steps and
    after the last step (eval/accuracy, eval/reward); 0 turns it off. It never changes the
    training numbers (its RNG and SR state are restored)."""
    eval_size: int = 64
    """Problems in the held-out set (seeded from `seed`, a stream no training prompt uses)."""

    # ---- run -----------------------------------------------------------------------------
    seed: int = 0
    device: str = "cpu"
    compile: bool = True
    """True: learner and engine run through the minite backend (the product). False: eager
    FP32 transformers on both sides (loop-logic tests only: no NVFP4 at all)."""
    rollout_cuda_graphs: bool = False
    """CUDA only: the rollout engine decodes through one CUDA graph per batch bucket, captured
    once and replayed across generate calls and weight updates (same kernels, same bits:
    `RolloutEngine(cuda_graphs=True)`)."""
    rollout_engine: str = "minite"
    """A name of the engine table `ENGINES` (rl/train/engines.py). "minite": the embedded
    engine (learner == rollout, bitwise). "vllm": vLLM with minite's plugin
    (`fp4_compile.rl.VLLMRolloutEngine`, needs vLLM, one process), bitwise wherever minite has a
    vLLM model class (Qwen3, Qwen3-MoE: the learner's norms, rotary, attention on vLLM's paged
    cache, log-probs), else minite's linears only. "vllm_full": the model class or an error.
    "vllm_linears" (an explicit choice): minite's linears and weights as NVFP4 bytes, vLLM's
    attention, norms and sampler (close, not bitwise). docs/vllm.md. "stock" (the alignment
    ablation's deliberate mismatch, rl/train/stock_rollout.py): an eager BF16 transformers
    rollout on the learner's decoded NVFP4 weights, activations unquantized (W4A16, as vLLM
    serves an NVFP4 checkpoint on Hopper): the same weights, not the same numerics.
    docs/alignment.md."""
    rollout_max_batch: int = 0
    """Requests the rollout engine runs at once (its KV cache rows); 0: the whole rollout batch
    of this process (prompts_per_step x group_size / processes). The trainer calls `generate`
    once over the whole rollout batch whatever this is: the embedded engine batches it
    continuously (the same bits at any value), the stock engine in static waves of this size."""
    rollout_kv_tokens: int = 0
    """The embedded engine's KV cache. 0: static, one row of the longest sequence per running
    request (rollout_max_batch x width, per layer). > 0: a paged cache of this many tokens
    shared by the running requests (`RolloutEngine(kv_cache="paged", kv_tokens=...)`): pages
    are granted as requests grow and freed as they finish; when the pool runs out the youngest
    request restarts from its prompt with its seed (the same bits). A request that could never
    fit is refused before any work. Same tokens and log-probs as the static cache."""
    rollout_weights: str = "bf16+packed"
    """The embedded engine's weight copy (`RolloutEngine(weights=...)`, the same bits either
    way): "bf16+packed" keeps its BF16 parameters and the packed NVFP4 store; "packed" keeps only
    what its compiled step reads (E2M1 codes, E4M3 scales, global scales, and the BF16 weights
    the recipe leaves unquantized), about 3.5x fewer bytes for the quantized weights. "packed"
    needs rollout_engine="minite", compile=True and a quantizing variant (strict, te)."""
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    log_every: int = 1
    out_dir: str = "runs/custom"
    cache_dir: str = "runs/cache"

    def __post_init__(self) -> None:
        _check_types(self)
        choices = {
            "variant": VARIANTS,
            "arch": ARCHS,
            "task": TASK_NAMES,
            "aggregation": AGGREGATIONS,
            "advantage_scale": ADVANTAGE_SCALES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        positive = (
            "hidden",
            "layers",
            "heads",
            "kv_heads",
            "head_dim",
            "intermediate",
            "experts",
            "experts_per_token",
            "moe_intermediate",
            "num_digits",
            "prompts_per_step",
            "group_size",
            "steps",
            "updates_per_batch",
            "warm_start_batch",
            "checkpoint_every",
            "keep_checkpoints",
            "log_every",
            "eval_size",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0 = off), got {self.eval_every}")
        if self.max_new_tokens < 0:
            raise ValueError(
                f"max_new_tokens must be >= 0 (0 = the task's answer length), got {self.max_new_tokens}"
            )
        if self.warm_start_steps < 0:
            raise ValueError(f"warm_start_steps must be >= 0, got {self.warm_start_steps}")
        if self.group_size < 2:
            raise ValueError(
                f"group_size must be >= 2 (advantages are relative), got {self.group_size}"
            )
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")
        if self.experts_per_token > self.experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} > experts={self.experts}")
        for name in ("lr", "warm_start_lr", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.model:  # refused in milliseconds, before any work, naming file and fix
            check_model_dir(self.model)
        if self.rollout_cuda_graphs and not engine_entry(self.rollout_engine).cuda_graphs:
            raise ValueError(
                f"rollout_cuda_graphs=True is for the embedded engine, not {self.rollout_engine!r}"
            )
        engine_entry(self.rollout_engine)  # a name of the table, or an error listing them
        if not isinstance(self.rollout_max_batch, int) or self.rollout_max_batch < 0:
            raise ValueError(
                f"rollout_max_batch must be an int >= 0 (0: the whole rollout batch), got "
                f"{self.rollout_max_batch!r}"
            )
        self._check_rollout_weights()
        if not isinstance(self.rollout_kv_tokens, int) or self.rollout_kv_tokens < 0:
            raise ValueError(
                f"rollout_kv_tokens must be an int >= 0 (0: a static KV cache), got "
                f"{self.rollout_kv_tokens!r}"
            )
        if self.rollout_kv_tokens and self.rollout_engine != "minite":
            raise ValueError(
                f"rollout_kv_tokens sizes the embedded engine's paged KV cache (rollout_engine="
                f"'minite'); {self.rollout_engine!r} sizes its own"
            )
        if self.rollout_cuda_graphs and not self.device.startswith("cuda"):
            raise ValueError(
                f"rollout_cuda_graphs=True needs a CUDA device, got device={self.device!r}"
            )

    def _check_rollout_weights(self) -> None:
        if self.rollout_weights not in WEIGHT_FORMS:
            raise ValueError(
                f"rollout_weights must be one of {tuple(WEIGHT_FORMS)}, got {self.rollout_weights!r}"
            )
        if self.rollout_weights == "bf16+packed":
            return
        if self.rollout_engine != "minite":
            raise ValueError(
                f"rollout_weights='packed' is the embedded engine's option (rollout_engine="
                f"'minite'), not {self.rollout_engine!r}'s"
            )
        if not self.compile:
            raise ValueError(
                "rollout_weights='packed' needs compile=True (the eager step reads BF16)"
            )
        if self.variant == "bf16":
            raise ValueError(
                "rollout_weights='packed' releases the weights the recipe quantizes; "
                "variant='bf16' quantizes none: use rollout_weights='bf16+packed'"
            )

    def recipe(self) -> NVFP4Recipe:
        """The variant's recipe, with `bf16_modules` added to its own patterns."""
        recipe = {"strict": NVFP4Recipe.strict, "te": NVFP4Recipe.te, "bf16": NVFP4Recipe.bf16}[
            self.variant
        ]()
        if not self.bf16_modules:
            return recipe
        extra = tuple(p for p in self.bf16_modules if p not in recipe.bf16_modules)
        return dataclasses.replace(recipe, bf16_modules=recipe.bf16_modules + extra)

    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {unknown}")
        data = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()}
        return cls(**data)

    def numerics_dict(self) -> dict[str, Any]:
        """The fields a resumed run must share with the run that wrote the checkpoint (an empty
        `bf16_modules` is left out: checkpoints from before the field resume as they did)."""
        d = {k: v for k, v in self.to_dict().items() if k not in RESUMABLE_FIELDS}
        if not d["bf16_modules"]:
            del d["bf16_modules"]
        if not d["rollout_max_batch"]:  # the default (0) leaves older checkpoints resumable
            del d["rollout_max_batch"]
        return d

    def with_overrides(self, pairs: list[str]) -> TrainConfig:
        """Apply `key=value` strings, each parsed by the field's type ("none" for None,
        "low,high" for bounds, true/false for bools)."""
        hints = typing.get_type_hints(TrainConfig)
        changes: dict[str, Any] = {}
        for pair in pairs:
            key, sep, text = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not sep:
                raise ValueError(f"override {pair!r} must look like key=value")
            if key not in hints:
                close = difflib.get_close_matches(key, hints, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known: {sorted(hints)}"
                raise ValueError(f"unknown setting {key!r}; {hint}")
            changes[key] = _parse(key, text.strip(), hints[key])
        return dataclasses.replace(self, **changes)


def _parse(key: str, text: str, hint) -> Any:
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional and text.lower() == "none":
        return None
    base = next((a for a in args if a is not type(None)), hint) if optional else hint
    origin = typing.get_origin(base)
    try:
        if base is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if origin is tuple and typing.get_args(base)[0] is str:  # tuple[str, ...]: a,b,c
            return tuple(x.strip() for x in text.split(",") if x.strip())
        if origin is tuple:
            return tuple(float(x) for x in text.split(","))
        return base(text)
    except ValueError:
        raise ValueError(f"setting {key}={text!r} does not parse as {hint}") from None


def _check_types(cfg: TrainConfig) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(cfg):
        value, hint = getattr(cfg, f.name), hints[f.name]
        args = typing.get_args(hint)
        if type(None) in args:
            if value is None:
                continue
            hint = next(a for a in args if a is not type(None))
        origin = typing.get_origin(hint)
        if origin is tuple and typing.get_args(hint)[0] is str:
            ok = isinstance(value, tuple) and all(isinstance(x, str) and x for x in value)
        elif origin is tuple:
            ok = isinstance(value, tuple) and len(value) == 2
            ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
        elif hint is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif hint is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(hint, type):
            ok = isinstance(value, hint)
        else:  # pragma: no cover - a field type this checker does not know
            raise AssertionError(f"unchecked field type {hint!r} for {f.name}")
        if not ok:
            raise ValueError(f"{f.name} must be {hint}, got {value!r}")


def build_model(
    cfg: TrainConfig, vocab_size: int, *, device: torch.device | None = None
) -> torch.nn.Module:
    """The policy, FP32 (the master weights), in eval mode (no dropout: the learner and the
    rollout must run the same graph): `cfg.model`'s checkpoint (`vocab_size` is then the
    tokenizer's, checked against the embedding), else a random-init transformers Qwen3 /
    Qwen3-MoE causal LM with `vocab_size` rows. `device`: where the random-init model is built
    (default `cfg.device`; "meta" for its shapes alone)."""
    if cfg.model:
        # lazy: transformers is optional (the hf extra) and costs seconds at import
        from transformers import AutoModelForCausalLM

        torch.manual_seed(cfg.seed)  # any weights the checkpoint lacks are initialised reproducibly
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model, dtype=torch.float32, attn_implementation="sdpa"
        )
        rows = model.get_input_embeddings().weight.shape[0]
        if rows < vocab_size:
            raise ValueError(
                f"model={cfg.model!r}: the embedding has {rows} rows, fewer than the tokenizer's "
                f"{vocab_size} tokens"
            )
        return model.to(cfg.torch_device()).float().eval()
    common = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(cfg.seed)
    with device or cfg.torch_device():
        if cfg.arch == "qwen3":
            # lazy: transformers is optional (the hf extra) and costs seconds at import
            from transformers import Qwen3Config, Qwen3ForCausalLM

            model = Qwen3ForCausalLM(Qwen3Config(**common))
        else:
            # lazy: transformers is optional (the hf extra) and costs seconds at import
            from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

            moe = dict(
                moe_intermediate_size=cfg.moe_intermediate,
                num_experts=cfg.experts,
                num_experts_per_tok=cfg.experts_per_token,
                norm_topk_prob=True,
            )
            model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, **moe))
    return model.float().eval()


def model_dir_identity(path: str) -> dict[str, Any]:
    """What identifies a checkpoint directory without reading its weights: its config.json and
    the name and size of every file in it (a changed checkpoint changes the hash)."""
    folder = Path(path)
    files = sorted((p.name, p.stat().st_size) for p in folder.iterdir() if p.is_file())
    blob = json.dumps({"config": (folder / "config.json").read_text(), "files": files}).encode()
    return {"path": str(path), "sha256": hashlib.sha256(blob).hexdigest()}
