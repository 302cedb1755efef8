"""A model folder vLLM loads with minite's quantization method: the learner's master weights
(safetensors, the model's dtype) plus a config.json whose `quantization_config` names the method
and carries the recipe. vLLM quantizes each weight once after loading, with the learner's
quantizer (`fp4_compile.passes.targets.quantize_weight_bytes`), so its bytes are the learner's."""

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


def write_model_folder(
    model, path: str | Path, *, recipe: NVFP4Recipe | dict | str | None = None
) -> Path:
    """Save a transformers causal LM (the learner's module; a compiled wrapper is unwrapped)
    into the folder `path` for `vllm.LLM(path)`. Returns the folder."""
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
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder
