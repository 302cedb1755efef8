"""`minite train ... --print-config` (rl/cli/train.py): it prints what the run would use."""

from model_dirs import save_model_dir

from fp4_compile.cli import main


def test_print_config_shows_what_the_run_uses(tmp_path, monkeypatch, capsys):
    """`--print-config` prints the run folder the run would take (the next numbered one when
    runs/tiny-strict holds a run) and, for model=DIR, the checkpoint's architecture instead of
    the preset's fields, which that run ignores."""
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "tiny-strict").mkdir(parents=True)
    (tmp_path / "runs" / "tiny-strict" / "metrics.jsonl").write_text("{}\n")
    assert main(["train", "tiny", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["out_dir"] == "runs/tiny-strict-2"
    model_dir = save_model_dir(tmp_path / "my-qwen3")
    capsys.readouterr()
    assert main(["train", "tiny", f"model={model_dir}", "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert "hidden" not in printed and "layers" not in printed and "arch" not in printed
    assert printed["model_config"]["hidden_size"] == 64
    assert printed["model_config"]["num_hidden_layers"] == 1
    assert printed["model_config"]["model_type"] == "qwen3"
    assert printed["out_dir"] == "runs/my-qwen3-tiny-strict"
