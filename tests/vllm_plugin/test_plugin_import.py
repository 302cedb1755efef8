"""The plugin package imports without vLLM (its entry point is installed in every env with
minite), and its model folder carries the recipe vLLM's quantization config reads back."""

from __future__ import annotations

import json

import pytest

from fp4_compile.models import tiny_qwen3
from fp4_compile.recipe import NVFP4Recipe
from fp4_compile.vllm_plugin import vllm_available


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


def test_engine_refuses_a_recipe_that_is_not_batch_invariant():
    from fp4_compile.rl import VLLMRolloutEngine

    with pytest.raises(ValueError, match="batch-invariant"):
        VLLMRolloutEngine(tiny_qwen3(layers=1), recipe="te")


@pytest.mark.skipif(vllm_available(), reason="checks the error where vLLM is absent")
def test_engine_without_vllm_says_how_to_install():
    from fp4_compile.rl import VLLMRolloutEngine

    with pytest.raises(ImportError, match=r"\[vllm\]"):
        VLLMRolloutEngine(tiny_qwen3(layers=1))


def test_full_folder_names_minite_class(tmp_path):
    from fp4_compile.vllm_plugin import write_model_folder

    folder = write_model_folder(tiny_qwen3(layers=1), tmp_path / "f", full=True, temperature=0.7)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["MiniteQwen3ForCausalLM"]
    assert config["minite_logprob_temperature"] == 0.7
    with pytest.raises(ValueError, match="temperature"):
        write_model_folder(tiny_qwen3(layers=1), tmp_path / "g", full=True, temperature=0.0)


def test_full_class_exists_for_qwen3_and_qwen3_moe_only():
    """VLLMRolloutEngine's default (full=None) is minite's bitwise model class exactly where one
    exists."""
    import torch

    from fp4_compile.models import tiny_qwen3_moe
    from fp4_compile.vllm_plugin.model_folder import has_full_class

    assert has_full_class(tiny_qwen3(layers=1))
    assert has_full_class(tiny_qwen3_moe(seed=0))
    assert not has_full_class(torch.nn.Linear(2, 2))
