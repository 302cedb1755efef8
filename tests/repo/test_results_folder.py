"""benchmarks/results/ keeps the latest run per topic and the cited older ones, 80 files at most
(older runs of a topic fold into one file, a section each; history stays in git), and its index
(benchmarks/results/README.md) is true: every file it names is there, every file there is named
(a file's `.json`, `.log`, `.png` go with its `.md`: "(+ `.json`)"). Exact, on the tree."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"
MAX_FILES = 80  # README.md included
NAME = re.compile(r"`(20\d\d-\d\d-\d\d_[A-Za-z0-9_.+-]*[A-Za-z0-9])`")


def _files() -> list[str]:
    return sorted(p.name for p in RESULTS.iterdir() if p.is_file())


def _run(name: str) -> str:
    """A result file's run: its name without the suffix (and a figure's `_curves`)."""
    return re.sub(r"(_curves)?\.[a-z]+$", "", name)


def test_at_most_80_files():
    files = _files()
    assert len(files) <= MAX_FILES, (
        f"benchmarks/results/ holds {len(files)} files (at most {MAX_FILES}): keep the latest run "
        "per topic and the cited ones, fold older runs of a topic into one file"
    )


def test_the_index_names_only_files_that_are_there():
    named = NAME.findall(INDEX.read_text())
    assert len(named) > 20
    missing = [n for n in named if not (RESULTS / n).exists()]
    assert not missing, f"the index names files that are not there: {missing}"


def test_every_file_is_in_the_index():
    runs = {_run(n) for n in NAME.findall(INDEX.read_text())}
    unnamed = [n for n in _files() if n != "README.md" and _run(n) not in runs]
    assert not unnamed, f"files the index does not name: {unnamed}"
