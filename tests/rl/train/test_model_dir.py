"""`model=DIR` folders minite cannot train are refused before any work (fp4_compile/model_dir.py,
re-exported by rl/train/model_dir.py).

Contract: each of these folders, built here with `save_pretrained` (no downloads), makes
`minite train tiny model=DIR ...` exit 2 in under 15 s with ONE line on stderr that names the
file or setting, the cause and what to do: a GPT-2 (an architecture minite does not lower), a
Gemma2 (needs eager attention: minite's refusal, not transformers' advice to load it eager), a
truncated model.safetensors, a config-only folder (would train random weights), a folder
without a tokenizer. `minite diagnose --model DIR` loads the folder's weights; `--model
DIR/config.json` says that its weights are random."""

import json
import shutil
import time

import pytest
from model_dirs import save_model_dir

from fp4_compile.cli import main
from fp4_compile.rl.train.model_dir import SUPPORTED_MODEL_TYPES, check_model_dir


def _refused(capsys, tmp_path, folder, *expected):
    capsys.readouterr()  # what building the folder printed
    t0 = time.perf_counter()
    rc = main(["train", "tiny", f"model={folder}", f"out_dir={tmp_path / 'run'}", "steps=2"])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    for text in expected:
        assert text in err[0], err[0]
    assert took < 15, took
    assert not (tmp_path / "run").exists()  # nothing was started
    return err[0]


def test_gpt2_is_refused_naming_the_architecture(tmp_path, capsys):
    folder = save_model_dir(tmp_path / "gpt2", "gpt2")
    _refused(
        capsys, tmp_path, folder, "model_type 'gpt2'", "GPT2LMHeadModel", "does not lower", "qwen3"
    )


def test_gemma2_gets_minites_refusal(tmp_path, capsys):
    folder = save_model_dir(tmp_path / "gemma2", "gemma2")
    line = _refused(capsys, tmp_path, folder, "model_type 'gemma2'", "eager")
    assert "Gemma or Gemma3" in line


def test_truncated_safetensors_names_the_file(tmp_path, capsys):
    folder = save_model_dir(tmp_path / "cut")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    _refused(capsys, tmp_path, folder, str(weights), "truncated", "download or save it again")
    weights.write_bytes(b"\x10")
    _refused(capsys, tmp_path, folder, str(weights), "truncated")


def test_config_only_folder_is_refused(tmp_path, capsys):
    folder = save_model_dir(tmp_path / "cfg")
    (folder / "model.safetensors").unlink()
    _refused(capsys, tmp_path, folder, "no weights", "random weights", "model=")


def test_folder_without_tokenizer_is_refused(tmp_path, capsys):
    folder = save_model_dir(tmp_path / "notok", tokenizer=False)
    _refused(capsys, tmp_path, folder, "no tokenizer", "save_pretrained")


def test_missing_shard_is_refused(tmp_path, tiny_model_dir):
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_model_dir, folder)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="model-00001-of-00002.safetensors"):
        check_model_dir(folder)


def test_supported_model_types_are_the_tested_architectures():
    """The accepted `model_type`s are exactly the families tests/core/test_architectures.py trains
    (fp4_compile.models.ARCHITECTURES, Gemma2 excluded: refused, eager attention)."""
    import transformers

    from fp4_compile.models import ARCHITECTURES

    tested = {
        getattr(transformers, config).model_type: family
        for family, (config, _, _) in ARCHITECTURES.items()
        if family not in ("gemma2", "llama_tied")
    }
    assert tested == SUPPORTED_MODEL_TYPES


def test_diagnose_takes_a_model_dir(tiny_model_dir, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    from fp4_compile.rl.diagnostics.gap_report import build_model

    model = build_model(str(tiny_model_dir))
    want = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    for k, v in want.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    build_model(str(tiny_model_dir / "config.json"), log=print)
    assert "random weights" in capsys.readouterr().out
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        folder = save_model_dir(tiny_model_dir.parent / "gpt2-diag", "gpt2")
        build_model(str(folder))
