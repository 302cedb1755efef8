"""`minite export RUN_DIR` as the README prints it: the format defaults to compressed-tensors and
the folder to RUN_DIR/export/compressed-tensors-step_N; a non-empty --out is refused (naming
--overwrite) unless --overwrite, which replaces an earlier minite export and nothing else."""

import json
import warnings

import pytest
from model_dirs import make_run

from fp4_compile.cli import main


def _export(*argv):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # export_checkpoint's note on activation scales
        return main(["export", *argv])


def test_export_run_dir_with_defaults(tmp_path, capsys):
    run = make_run(tmp_path / "runs" / "tiny-strict")
    assert _export(str(run)) == 0
    out = run / "export" / "compressed-tensors-step_00000030"
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["format"] == "nvfp4-pack-quantized"
    assert (out / "model.safetensors").is_file()
    printed = capsys.readouterr().out
    assert str(out) in printed
    assert "needs compressed-tensors: pip install 'minite[ct]'" in printed, printed


def test_non_empty_out_needs_overwrite(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    out = tmp_path / "ct"
    assert _export(str(run), "--out", str(out)) == 0
    before = (out / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert _export(str(run), "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "holds an earlier minite export; pass --overwrite" in err and str(out) in err, err
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    # --overwrite replaces it; a modelopt export leaves no compressed-tensors file behind
    (out / "stale.txt").write_text("x")
    assert _export(str(run), "--out", str(out), "--format", "modelopt", "--overwrite") == 0
    assert (out / "hf_quant_config.json").is_file() and not (out / "stale.txt").exists()
    # ... but never a folder that is not an export
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert _export(str(run), "--out", str(other), "--overwrite") == 2
    assert (other / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("fmt", ["compressed-tensors", "modelopt"])
def test_default_out_follows_the_format(tmp_path, fmt):
    run = make_run(tmp_path / "run", step=7)
    assert _export(str(run / "checkpoints" / "step_00000007.ckpt"), "--format", fmt) == 0
    assert (run / "export" / f"{fmt}-step_00000007" / "config.json").is_file()


def test_unrelated_out_is_refused_without_suggesting_overwrite(tmp_path, capsys):
    """A --out holding a user's own files is refused the first time with what to do (another
    folder), never with advice (--overwrite) that would be refused in turn."""
    run = make_run(tmp_path / "run")
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):
        assert _export(str(run), "--out", str(other), *extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert "holds files that are not a minite export (notes.txt)" in err[0], err
        assert "pass --overwrite" not in err[0] and "--out NEW_FOLDER" in err[0], err
    assert (other / "notes.txt").read_text() == "keep me"
