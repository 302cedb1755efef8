"""A model folder vLLM loads with minite's quantization method: the learner's master weights
(safetensors, the model's dtype) plus a config.json whose `quantization_config` names the method
and carries the recipe. vLLM quantizes each weight once after loading, with the learner's
quantizer (`fp4_compile.codegen.nvfp4.api.quantize_weight_bytes`), so its bytes are the learner's."""

from __future__ import annotations

import json
from pathlib import Path

from ..recipe import NVFP4Recipe, as_recipe

QUANTIZATION_NAME = "minite"
RECIPE_KEY = "recipe"
CONFIG = "config.json"


def quantization_config(recipe: NVFP4Recipe) -> dict:
    """config.json's `quantization_config` for the "minite" method."""
    return {
        "quant_method": QUANTIZATION_NAME,
        RECIPE_KEY: recipe.to_dict(),
        "fingerprint": recipe.fingerprint(),
    }


# the model class of the "full" variant (fp4_compile/vllm_plugin/qwen3.py), by model type
FULL_ARCHITECTURES = {"qwen3": "MiniteQwen3ForCausalLM", "qwen3_moe": "MiniteQwen3MoeForCausalLM"}
TEMPERATURE_KEY = "minite_logprob_temperature"


def has_full_class(model) -> bool:
    """Whether minite has a full vLLM model class (bitwise with the learner) for this
    transformers model's type."""
    model = getattr(model, "_orig_mod", model)
    return getattr(getattr(model, "config", None), "model_type", None) in FULL_ARCHITECTURES


def write_model_folder(
    model,
    path: str | Path,
    *,
    recipe: NVFP4Recipe | dict | str | None = None,
    full: bool = False,
    temperature: float = 1.0,
) -> Path:
    """Save a transformers causal LM (the learner's module; a compiled wrapper is unwrapped)
    into the folder `path` for `vllm.LLM(path)`. Returns the folder. full=True names minite's
    model class (learner's norms, rotary, attention on vLLM's paged cache, log-probs at
    `temperature`) instead of vLLM's own."""
    recipe = as_recipe(recipe)
    model = getattr(model, "_orig_mod", model)
    if not hasattr(model, "save_pretrained"):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    config_path = folder / CONFIG
    config = json.loads(config_path.read_text())
    config["quantization_config"] = quantization_config(recipe)
    if full:
        arch = FULL_ARCHITECTURES.get(config.get("model_type"))
        if arch is None:
            raise ValueError(
                f"full=True supports model types {sorted(FULL_ARCHITECTURES)}, got "
                f"{config.get('model_type')!r}"
            )
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        config["architectures"] = [arch]
        config[TEMPERATURE_KEY] = float(temperature)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder
