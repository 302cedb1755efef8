"""The README's Usage snippet is complete: every name it reads is imported or assigned in it
(a user can paste it), its prompts are token-id lists, and `python -m benchmarks` /
`python -m tools` print an index of what is there, one line per module."""

import ast
import builtins
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _usage_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Usage", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_usage_snippet_defines_every_name_it_reads():
    tree = ast.parse(_usage_block())
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.comprehension):
            defined |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert read <= defined, sorted(read - defined)
    assert "token ids" in _usage_block()


def test_benchmarks_and_tools_print_an_index():
    for package, expected in (("benchmarks", "step_cost"), ("tools", "localize_gpu")):
        out = subprocess.run(
            [sys.executable, "-m", package],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        assert out.startswith(f"python -m {package}.<name>:"), out
        modules = {p.stem for p in (ROOT / package).glob("*.py") if not p.stem.startswith("_")}
        listed = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
        assert listed == modules, modules ^ listed
        line = next(x for x in out.splitlines() if x.split()[:1] == [expected])
        assert len(line.split(maxsplit=1)[1]) > 20, line  # a description, not just a name


def test_readme_timings_say_what_was_measured_where():
    """The quick start's timings name the command and the machine they were measured on, and
    say that other models take longer (they are not a promise for every model)."""
    text = " ".join((ROOT / "README.md").read_text().split())
    sentence = text[text.index("Measured for this command") :].split("## ")[0]
    assert "`minite train tiny`" in sentence and "2 idle CPU cores" in sentence, sentence
    assert "Other models and presets take longer" in sentence, sentence
