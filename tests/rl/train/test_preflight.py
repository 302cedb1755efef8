"""The pre-flight shape check of `minite train` (rl/train/preflight.py). Contract: a model whose
GEMMs cannot be NVFP4 (K or N not a multiple of 16) is refused by the strict variant before any
work (no warm start, no run folder), in one line naming the modules and the `bf16_modules=`
setting, and that setting, given on the command line, is what the recipe then keeps BF16."""

import time

from model_dirs import save_qwen3_hidden_72

from fp4_compile.cli import main
from fp4_compile.rl.train.preflight import check_gemm_shapes, model_skeleton
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.weight_policy import shape_fallbacks


def test_odd_hidden_size_is_refused_before_the_warm_start(tmp_path, monkeypatch, capsys):
    model_dir = save_qwen3_hidden_72(tmp_path / "qwen3-72")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # save_pretrained's progress bar
    t0 = time.perf_counter()
    assert main(["train", "tiny", f"model={model_dir}", "--no-progress"]) == 2
    took = time.perf_counter() - t0
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err
    assert "model.layers.0.self_attn.q_proj (N=" in err[0] and "K=72" in err[0], err[0]
    assert "'bf16_modules=*model.layers.*.self_attn.q_proj," in err[0], err[0]
    assert "warm start" not in captured.out and not (tmp_path / "runs").exists()
    assert took < 20, took  # before any training work (only transformers' import and a config)


def test_bf16_modules_from_the_command_line_keeps_them_bf16(tmp_path, capsys):
    model_dir = save_qwen3_hidden_72(tmp_path / "qwen3-72")
    cfg = get_preset("tiny").with_overrides([f"model={model_dir}"])
    odd = shape_fallbacks(model_skeleton(cfg), cfg.recipe())
    assert odd and all(k == 72 or n == 72 for _, n, k in odd), odd
    patterns = "*model.layers.*.self_attn.*,*model.layers.*.mlp.*"
    fixed = cfg.with_overrides([f"bf16_modules={patterns}"])
    assert fixed.bf16_modules == ("*model.layers.*.self_attn.*", "*model.layers.*.mlp.*")
    recipe = fixed.recipe()
    assert recipe.bf16_modules[: len(cfg.recipe().bf16_modules)] == cfg.recipe().bf16_modules
    assert recipe.bf16_modules[-2:] == fixed.bf16_modules
    check_gemm_shapes(fixed)  # no longer refused
    assert shape_fallbacks(model_skeleton(fixed), recipe) == []
    # the setting also parses through the CLI (and prints as a list)
    assert main(["train", "tiny", f"bf16_modules={patterns}", "--print-config"]) == 0
    assert '"*model.layers.*.mlp.*"' in capsys.readouterr().out


def test_preset_models_pass_the_check_and_te_only_warns():
    check_gemm_shapes(get_preset("tiny"))
    check_gemm_shapes(get_preset("tiny").with_overrides(["arch=qwen3_moe"]))
    check_gemm_shapes(get_preset("tiny", "te").with_overrides(["hidden=72"]))
