"""Every command the README prints works as printed (kept under a minute: the expensive ones are
run by CI or by their own tests).

- ```bash blocks: each command (split at `&&`) is checked: `pip install -e ".[x,y]"` names
  extras pyproject.toml defines; `python -m MODULE` names an importable module; `minite train
  ...` resolves its settings (`--print-config`: the run itself is CI's main job, and
  tests/rl/train/test_run_dir.py runs the same command twice); `minite export runs/tiny-strict`
  runs, as printed, on a run folder holding a checkpoint of the tiny preset; any other `minite`
  command parses.
- inline `minite ...` spans in the prose parse with the real `minite` parser (placeholders such
  as RUN_DIR are positional arguments), and `minite train` ones resolve their settings."""

import re
import shlex
import warnings
from pathlib import Path

import pytest
from model_dirs import make_run

from fp4_compile.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def block_commands() -> list[str]:
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            cmd: list[str] = []
            for word in [*shlex.split(line, comments=True), "&&"]:
                if word != "&&":
                    cmd.append(word)
                elif cmd:
                    cmds.append(shlex.join(cmd))
                    cmd = []
    return cmds


def inline_commands() -> list[str]:
    return re.findall(r"`(minite [^`]*)`", README)


def test_the_readme_has_its_commands():
    cmds = block_commands()
    assert any(c.startswith("minite train tiny") for c in cmds), cmds
    assert "minite export runs/tiny-strict" in cmds, cmds
    assert len(inline_commands()) >= 4


@pytest.mark.parametrize("cmd", block_commands())
def test_block_command_works_as_printed(cmd, tmp_path, monkeypatch, capsys):
    argv = shlex.split(cmd)
    if argv[:4] == ["python", "-m", "pip", "install"]:
        pyproject = (ROOT / "pyproject.toml").read_text()
        section = pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0]
        defined = set(re.findall(r"^(\w+) = \[", section, re.M))
        for arg in argv[4:]:
            if m := re.fullmatch(r"\.\[([\w,]+)\]", arg):  # the extras of this package
                assert set(m.group(1).split(",")) <= defined, (arg, defined)
            elif not arg.startswith("-"):  # a requirement: one of the package's dependencies
                name = re.split(r"[=<>]", arg)[0]
                assert f'"{name}>=' in pyproject, arg
        return
    if argv[:2] == ["python", "-m"]:
        import importlib.util

        assert importlib.util.find_spec(argv[2]) is not None, argv[2]
        return
    assert argv[0] == "minite", cmd
    if argv[1] == "train":
        assert main([*argv[1:], "--print-config"]) == 0
    elif argv[1] == "export":
        monkeypatch.chdir(tmp_path)
        make_run(Path("runs/tiny-strict"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(argv[1:]) == 0, capsys.readouterr().err
        assert Path(
            "runs/tiny-strict/export/compressed-tensors-step_00000030/config.json"
        ).is_file()
        assert "runs/tiny-strict/export/compressed-tensors-step_00000030" in README
    else:
        build_parser().parse_args(argv[1:])


@pytest.mark.parametrize("cmd", inline_commands())
def test_inline_command_parses(cmd):
    argv = shlex.split(cmd)[1:]
    build_parser().parse_args(argv)  # SystemExit (a failure) if it does not parse
    if argv[0] == "train":
        assert main([*argv, "--print-config"]) == 0
