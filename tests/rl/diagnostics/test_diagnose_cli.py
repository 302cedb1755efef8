"""`minite diagnose` before any work (rl/diagnostics/gap_report.py). Contract: a result is never
replaced silently (without --out each run takes the next numbered folder; a named folder holding a
result is refused unless --overwrite), and a model whose GEMMs the strict recipe cannot quantize
is refused in one line naming the modules and `--bf16-modules`, before any compile."""

import pytest
from model_dirs import save_qwen3_hidden_72

from fp4_compile.cli import main
from fp4_compile.rl.diagnostics.gap_report import diagnose_dir


def test_each_diagnose_gets_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert str(diagnose_dir(None)) == "runs/diagnose"
    (tmp_path / "runs" / "diagnose").mkdir(parents=True)
    (tmp_path / "runs" / "diagnose" / "diagnose.json").write_text("{}")
    assert str(diagnose_dir(None)) == "runs/diagnose-2"
    with pytest.raises(ValueError, match="already holds a diagnose result.*--overwrite"):
        diagnose_dir("runs/diagnose")
    assert str(diagnose_dir("runs/diagnose", overwrite=True)) == "runs/diagnose"


def test_odd_shapes_are_refused_naming_bf16_modules(tmp_path, monkeypatch, capsys):
    model_dir = save_qwen3_hidden_72(tmp_path / "qwen3-72")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["diagnose", "--model", str(model_dir)]) == 2
    # transformers' weight-loading progress bar aside, one line
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("minite")]
    assert len(err) == 1, err
    assert "model.layers.0.mlp.up_proj (N=144, K=72)" in err[0], err
    assert "--bf16-modules '*model.layers.*.self_attn.q_proj," in err[0], err
