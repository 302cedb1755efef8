"""`NVFP4Recipe`: the one object that decides all of minite's numerics.

Frozen, validated, serializable, fingerprinted. Nothing that changes numerics is read from
environment variables. The fingerprint enters the compile cache key and every exported artifact.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .format import BLOCK_SHAPES, GLOBAL_SCALE_MODES, ROUNDING_MODES

FORMAT_VERSION = 2
GEMM_PRECISIONS = ("nvfp4", "bf16")


@dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """How one role (activations, weights or gradients) is quantized."""

    block: str = "1x16"
    """Scale block: "1x16" along K, or "16x16" tiles (weights only: W and W^T quantize alike,
    which the dgrad GEMM needs)."""

    global_scale: str = "per_row"
    """"per_row" (one FP32 scale per token: batch-invariant), "per_tensor" (amax over the whole
    tensor: NOT batch-invariant for activations), or "static" (a calibrated amax per layer)."""

    rounding: str = "rne"
    """"rne" (round to nearest even) or "stochastic" (seeded; gradients only)."""

    def validate(self, role: str) -> None:
        if self.block not in BLOCK_SHAPES:
            raise ValueError(f"{role}.block must be one of {BLOCK_SHAPES}, got {self.block!r}")
        if self.global_scale not in GLOBAL_SCALE_MODES:
            raise ValueError(
                f"{role}.global_scale must be one of {GLOBAL_SCALE_MODES}, got {self.global_scale!r}"
            )
        if self.rounding not in ROUNDING_MODES:
            raise ValueError(
                f"{role}.rounding must be one of {ROUNDING_MODES}, got {self.rounding!r}"
            )
        if self.block == "16x16" and role != "weight":
            raise ValueError(f"{role}.block='16x16' is for weights only; use '1x16'")
        if self.block == "16x16" and self.global_scale == "per_row":
            raise ValueError(
                f"{role}.global_scale='per_row' with 16x16 tiles would quantize W and W^T "
                "differently; use 'per_tensor' or 'static'"
            )
        if self.rounding == "stochastic" and role != "grad":
            raise ValueError(
                f"{role}.rounding='stochastic' is for gradients only (it would make the forward, "
                "and so learner vs rollout, depend on a random stream)"
            )


DEFAULT_BF16_MODULES = ("*embed_tokens*", "*lm_head*", "*.mlp.gate", "*router*")


@dataclass(frozen=True, kw_only=True)
class NVFP4Recipe:
    """All numerics of a learner/rollout pair. Use a preset (`strict`, `te`, `bf16`) and
    `dataclasses.replace` (or `with_`) to change a field."""

    quantize: bool = True
    """False keeps every GEMM in BF16 (the baseline) while still using minite's batch-invariant
    kernels everywhere, so only the precision differs from the NVFP4 runs."""

    activation: QuantSpec = field(
        default_factory=lambda: QuantSpec(block="1x16", global_scale="per_row")
    )
    """Forward GEMM input X (1x16 blocks)."""

    weight: QuantSpec = field(
        default_factory=lambda: QuantSpec(block="16x16", global_scale="per_tensor")
    )
    """Weights W: 16x16 tiles so fprop and dgrad use the same quantized bytes."""

    shared_weight_scale: bool = True
    """One weight global scale per group of linears that inference engines fuse into one layer
    (q/k/v of one attention, gate/up of one MLP; `weight_policy.py`): each member is
    quantized with the global scale of the group's amax (the max of the members' amaxes), so an
    exported checkpoint's shards carry equal global scales and an engine that keeps ONE scale per
    fused layer (vLLM) decodes the learner's bytes exactly. Weights only: still batch-invariant.
    Fused MoE experts share one scale per expert over gate and up either way (one tensor)."""

    grad: QuantSpec = field(
        default_factory=lambda: QuantSpec(
            block="1x16", global_scale="per_tensor", rounding="stochastic"
        )
    )
    """Output gradient dY in dgrad and wgrad (1x16 along each GEMM's K, stochastic rounding)."""

    dgrad: str = "nvfp4"
    """dX = dY @ W: "nvfp4" (dY quantized per `grad`, W reused) or "bf16"."""

    wgrad: str = "nvfp4"
    """dW = dY^T @ X: "nvfp4" (both operands 1x16 along tokens) or "bf16"."""

    seed: int = 0
    """Base seed of the stochastic rounding streams (gradients only)."""

    bf16_modules: tuple[str, ...] = DEFAULT_BF16_MODULES
    """fnmatch patterns of module names whose GEMMs stay BF16: embeddings, lm_head, MoE router."""

    bf16_first_layers: int = 0
    """Keep the first N decoder layers in BF16."""

    bf16_last_layers: int = 0
    """Keep the last N decoder layers in BF16 (the NVFP4 pretraining paper keeps ~15%)."""

    def __post_init__(self) -> None:
        for name in ("quantize", "shared_weight_scale"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for role in ("activation", "weight", "grad"):
            spec = getattr(self, role)
            if not isinstance(spec, QuantSpec):
                raise ValueError(f"{role} must be a QuantSpec, got {type(spec).__name__}")
            spec.validate(role)
        for name in ("dgrad", "wgrad"):
            if getattr(self, name) not in GEMM_PRECISIONS:
                raise ValueError(
                    f"{name} must be one of {GEMM_PRECISIONS}, got {getattr(self, name)!r}"
                )
        if not self.quantize and (self.dgrad != "bf16" or self.wgrad != "bf16"):
            raise ValueError("quantize=False needs dgrad='bf16' and wgrad='bf16'")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")
        if not isinstance(self.bf16_modules, tuple) or not all(
            isinstance(p, str) and p for p in self.bf16_modules
        ):
            raise ValueError(
                f"bf16_modules must be a tuple of non-empty strings, got {self.bf16_modules!r}"
            )
        for name in ("bf16_first_layers", "bf16_last_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        # The numerics key (see `numerics_key`), computed once and kept as a plain attribute, not
        # a field (it is derived: no part of to_dict or of equality). Code traced by Dynamo reads
        # it as a constant attribute; calling a function of the recipe needs the object
        # reconstructed, which torch 2.11's Dynamo cannot do for frozen dataclasses.
        object.__setattr__(self, "numerics_key", _encode(self))

    # ---- presets -------------------------------------------------------------------------
    @classmethod
    def strict(cls, **overrides: Any) -> NVFP4Recipe:
        """Batch-invariant W4A4 (the RL default): per-row activation scales, 16x16 weights."""
        return cls(**overrides)

    @classmethod
    def te(cls, **overrides: Any) -> NVFP4Recipe:
        """TransformerEngine-like: per-tensor activation amax. NOT batch-invariant: a token's
        quantization depends on the other tokens of the batch, so learner and rollout differ."""
        base = dict(activation=QuantSpec(block="1x16", global_scale="per_tensor"))
        return cls(**{**base, **overrides})

    @classmethod
    def bf16(cls, **overrides: Any) -> NVFP4Recipe:
        """No quantization, the same invariant kernels: the baseline."""
        base = dict(quantize=False, dgrad="bf16", wgrad="bf16")
        return cls(**{**base, **overrides})

    # ---- properties ----------------------------------------------------------------------
    @property
    def batch_invariant(self) -> bool:
        """True when every forward op computes each row independently of the batch."""
        return (not self.quantize) or self.activation.global_scale in ("per_row", "static")

    def with_(self, **changes: Any) -> NVFP4Recipe:
        return replace(self, **changes)

    # ---- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bf16_modules"] = list(self.bf16_modules)
        d["format_version"] = FORMAT_VERSION
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NVFP4Recipe:
        """The recipe of `to_dict`'s output; a format_version 1 dict (written before
        `shared_weight_scale` existed) gives the numerics it described: shared_weight_scale=False."""
        if not isinstance(data, dict):
            raise TypeError(f"from_dict expects a dict, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("format_version", FORMAT_VERSION)
        if version not in (1, FORMAT_VERSION):
            raise ValueError(
                f"format_version {version} is not supported (this is {FORMAT_VERSION})"
            )
        if version == 1:
            data.setdefault("shared_weight_scale", False)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown recipe fields: {unknown}")
        for role in ("activation", "weight", "grad"):
            if role in data and isinstance(data[role], dict):
                data[role] = QuantSpec(**data[role])
        if "bf16_modules" in data:
            data["bf16_modules"] = tuple(data["bf16_modules"])
        return cls(**data)

    def fingerprint(self) -> str:
        """Stable hash (16 hex digits) of every field: all of them affect numerics."""
        return hashlib.sha256(self.numerics_key.encode()).hexdigest()[:16]

    # ---- the ops' string argument ----------------------------------------------------------
    # `recipe.numerics_key` (a str attribute set at construction, not a field): this recipe as the
    # string the `fp4_compile::` NVFP4 ops take (their schema's `recipe` argument; encoded and
    # decoded in one place, `codegen/nvfp4/gemm_call.py`): compact JSON of `to_dict`, keys sorted.

    @classmethod
    def from_numerics_key(cls, key: str) -> NVFP4Recipe:
        """The recipe of an op's numerics key (cached: a graph's ops see a few keys, per call)."""
        return _decode(key)


def _encode(recipe: NVFP4Recipe) -> str:
    return json.dumps(recipe.to_dict(), sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=256)
def _decode(key: str) -> NVFP4Recipe:
    if not isinstance(key, str):
        raise TypeError(f"a numerics key must be a JSON string, got {type(key).__name__}")
    return NVFP4Recipe.from_dict(json.loads(key))


def as_recipe(recipe: NVFP4Recipe | dict | str | None) -> NVFP4Recipe:
    """Accept a recipe, its dict form, a preset name ("strict", "te", "bf16"), or None (strict)."""
    if recipe is None:
        return NVFP4Recipe.strict()
    if isinstance(recipe, NVFP4Recipe):
        return recipe
    if isinstance(recipe, dict):
        return NVFP4Recipe.from_dict(recipe)
    if isinstance(recipe, str):
        presets = {"strict": NVFP4Recipe.strict, "te": NVFP4Recipe.te, "bf16": NVFP4Recipe.bf16}
        if recipe not in presets:
            raise ValueError(f"recipe must be one of {sorted(presets)} by name, got {recipe!r}")
        return presets[recipe]()
    raise TypeError(
        f"recipe must be an NVFP4Recipe, a dict, a preset name or None, got {type(recipe).__name__}"
    )
