"""The plugin package imports without vLLM (its entry point is installed in every env with
minite), and its model folder carries the recipe vLLM's quantization config reads back."""

from __future__ import annotations

import json

from fp4_compile.models import tiny_qwen3
from fp4_compile.recipe import NVFP4Recipe


def test_plugin_package_imports_without_vllm():
    import fp4_compile.vllm_plugin as plugin

    assert plugin.QUANTIZATION_NAME == "minite"
    assert callable(plugin.register)
    assert isinstance(plugin.vllm_available(), bool)


def test_model_folder_records_the_recipe(tmp_path):
    from fp4_compile.vllm_plugin import RECIPE_KEY, write_model_folder

    recipe = NVFP4Recipe.strict(bf16_last_layers=1)
    folder = write_model_folder(tiny_qwen3(layers=2), tmp_path / "m", recipe=recipe)
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "minite"
    assert NVFP4Recipe.from_dict(qc[RECIPE_KEY]) == recipe
    assert qc["fingerprint"] == recipe.fingerprint()
    assert (folder / "model.safetensors").exists()
