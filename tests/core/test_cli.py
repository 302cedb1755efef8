"""The `minite` command line: a user mistake is ONE line on stderr (exit status 2) naming the
setting and, for a typo, the closest known one; `--debug` raises with the traceback instead."""

import pytest

from fp4_compile.cli import main


def test_typo_is_one_line_with_a_suggestion(capsys):
    assert main(["train", "tiny", "stpes=3", "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("minite: error: unknown setting 'stpes'; did you mean 'steps'?")


def test_bad_value_is_one_line(capsys):
    assert main(["train", "tiny", "steps=abc", "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "steps='abc'" in err[0], err


def test_debug_shows_the_exception():
    with pytest.raises(ValueError, match="unknown setting 'stpes'"):
        main(["train", "tiny", "stpes=3", "--print-config", "--debug"])


def test_print_config_resolves_the_preset(capsys):
    assert main(["train", "tiny", "steps=3", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert '"steps": 3' in out and '"name": "tiny"' in out


def test_help_says_where_runs_go_and_what_export_defaults_to(capsys):
    """`--help` states the run-folder rule (a numbered folder per run, --resume continues the
    newest) and export's defaults, which the README's commands rely on."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "runs/tiny-strict-2" in text and "--resume continues the newest" in text, text
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default compressed-tensors" in text and "RUN_DIR/export/FORMAT-step_N" in text
    assert "--overwrite" in text, text


def test_compile_error_keeps_its_cause(capsys, monkeypatch):
    """A backend error reaches the user as its own message on the one line, not as Dynamo's
    empty "backend='minite' raised:" wrapper."""
    import torch

    from fp4_compile import cli
    from fp4_compile.passes import LoweringError

    summary = (
        "minite could not lower this graph completely (nothing falls back silently):\n"
        "  - 1 GEMM(s) would stay BF16: model.layers.0.mlp.up_proj; list them in bf16_modules\n"
    )
    table = "module  kind  weight\n------  ----  ------\nmodel.layers.0.mlp.up_proj  linear"
    cause = LoweringError(summary + table, summary=summary)

    def compile_fails(argv):
        raise torch._dynamo.exc.BackendCompilerFailed(lambda *a: None, cause, None)

    monkeypatch.setattr(cli, "_run", compile_fails)
    assert main(["train", "tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "model.layers.0.mlp.up_proj; list them in bf16_modules (LoweringError;" in err[0], err
    assert "backend='minite' raised" not in err[0], err
    assert "module  kind" not in err[0], err  # the report table is for --debug
