"""Every result file a doc or a code comment names exists in benchmarks/results/ (a choice that
rests on a measurement names ONE result file: that file must be there to read)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
NAME = re.compile(r"\b(20\d\d-\d\d-\d\d_[A-Za-z0-9_.+-]*[A-Za-z0-9])\b")
SOURCES = [
    "README.md",
    "CONTRIBUTING.md",
    "docs",
    "fp4_compile",
    "passes",
    "codegen",
    "rl",
    "benchmarks",
    "tools",
    "tests",
]
SUFFIXES = {".md", ".py", ".sh", ".toml"}


def _cited() -> dict[str, list[str]]:
    cited: dict[str, list[str]] = {}
    for source in SOURCES:
        path = ROOT / source
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in files:
            if file.suffix not in SUFFIXES or RESULTS in file.parents or not file.is_file():
                continue
            for lineno, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                for name in NAME.findall(line):
                    if "*" in line[line.find(name) : line.find(name) + len(name) + 1]:
                        continue  # a glob names a family of files, not one
                    cited.setdefault(name, []).append(f"{file.relative_to(ROOT)}:{lineno}")
    return cited


def _exists(name: str) -> bool:
    if (RESULTS / name).exists():
        return True
    stem = name.removesuffix(".md").removesuffix(".json")
    return any(RESULTS.glob(stem + ".*")) or (RESULTS / stem).is_dir()


def test_the_scan_finds_citations():
    assert len(_cited()) > 5


def test_every_cited_result_file_exists():
    missing = {n: where for n, where in _cited().items() if not _exists(n)}
    assert not missing, "\n".join(f"{n}: cited at {', '.join(w[:3])}" for n, w in missing.items())
