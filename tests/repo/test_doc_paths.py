"""Every repository path a doc or a code comment names exists (no dead paths): the Markdown files
(README, CONTRIBUTING, docs/, the results index) and the text of the Python and shell sources,
comments and docstrings included. Resolved against the tree as it is when the test runs.

What counts as a path: a token that starts with a top-level folder of the repository
(`codegen/configs.py`, `docs/decode.md`, `benchmarks/results/<file>`), a Markdown link relative
to its file, and a module run or imported from benchmarks/ or tools/ (`python -m tools.ptx_audit`,
`benchmarks.common`). Placeholders (`<date>`, `{commit}`) and globs (`*localize_h200*`) must match
at least one file; `{md,json}` must match each alternative. Result files named without a folder
are tests/repo/test_cited_results.py's. The result files themselves (benchmarks/results/*,
except its index) are records of past runs and are not scanned."""

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a token that starts with a top-level folder: fp4_compile passes codegen rl tests benchmarks
# tools docs .ci
PATH = re.compile(
    r"(?<![\w./-])((?:fp4_compile|passes|codegen|rl|tests|benchmarks|tools|docs|\.ci)"
    r"/[\w./*<>{},-]*)"
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
MODULE = re.compile(r"(?<![\w./-])((?:benchmarks|tools)(?:\.[A-Za-z_]\w*)+)")
RESULTS = ROOT / "benchmarks" / "results"
SUFFIXES = {"py", "md", "sh", "json", "log", "txt", "png", "toml", "gz", "jsonl"}

# Dead paths in files other issue-55 work owns and edits meanwhile (rl/train/trainer.py), each
# with its replacement: the merge applies it there and deletes the entry. A listed name is
# tolerated in those files only; one that no file names dead any more fails
# `test_pending_entries_are_still_dead`, so the list cannot go stale.
PENDING_IN = ("codegen/", "fp4_compile/", "rl/train/trainer.py")
PENDING: dict[str, str] = {}


def _sources() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / ".ci" / "run"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files.append(RESULTS / "README.md")
    for top in ("fp4_compile", "passes", "codegen", "rl", "tests", "benchmarks", "tools"):
        files += [f for f in sorted((ROOT / top).rglob("*")) if f.suffix in (".py", ".sh", ".md")]
    this = Path(__file__).resolve()
    return [
        f
        for f in files
        if f.is_file() and f != this and (RESULTS not in f.parents or f.name == "README.md")
    ]


def _alternatives(token: str) -> list[str]:
    """`a/{x,y}.md` -> [a/x.md, a/y.md]; `<name>` and `{name}` -> `*`."""
    token = re.sub(r"<[^<>]*>", "*", token)
    token = re.sub(r"\{[^{},]*\}", "*", token)
    parts = re.split(r"\{([^{}]*)\}", token)
    choices = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _exists(path: str, base: Path = ROOT) -> bool:
    path = path.split("#")[0].rstrip(".,:;")
    while path.endswith("}") and path.count("}") > path.count("{"):  # ${VAR:-a/b.py}
        path = path[:-1]
    if not path:
        return True
    head, _, last = path.rpartition("/")
    module, _, attr = last.partition(".")
    if attr and attr.split(".")[-1] not in SUFFIXES and (base / head / f"{module}.py").is_file():
        return True  # a module and one of its names: rl/train/run_log.summary
    for alt in _alternatives(path):
        if "*" in alt:
            if not any(base.glob(alt.rstrip("/"))):
                return False
        elif not (base / alt).exists():
            return False
    return True


def _module_exists(name: str) -> bool:
    parts = name.split(".")
    for n in range(len(parts), 1, -1):  # benchmarks.common.write_results: the longest module
        stem = ROOT.joinpath(*parts[:n])
        if stem.with_suffix(".py").is_file() or (stem / "__init__.py").is_file():
            return True
    return False


def _dead_in_line(line: str, file: Path) -> list[str]:
    """The paths and modules `line` of `file` names that do not resolve."""
    dead = [p.rstrip(".,:;") for p in PATH.findall(line) if not _exists(p)]
    if file.suffix == ".md":
        links = [x for x in LINK.findall(line) if not re.match(r"[a-z]+:|#", x)]
        dead += [x for x in links if not _exists(x, file.parent)]
    return dead + [m for m in MODULE.findall(line) if not _module_exists(m)]


def _dead() -> dict[tuple[str, str], list[str]]:
    dead: dict[tuple[str, str], list[str]] = {}
    for file in _sources():
        where = file.relative_to(ROOT).as_posix()
        for lineno, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            for name in _dead_in_line(line, file):
                dead.setdefault((where, name), []).append(f"{where}:{lineno}")
    return dead


def test_the_scan_finds_paths():
    """The scan sees the paths it should: a missing one is reported, a present one is not."""
    assert _exists("codegen/") and _exists("benchmarks/results/README.md")
    assert _exists("benchmarks/results/*_step_cost_*.{md,json}")
    assert _exists("benchmarks/results/<date>_step_cost_<commit>.md")
    assert not _exists("codegen/no_such_file.py")
    assert not _exists("benchmarks/results/*_no_such_topic_*")
    assert _module_exists("benchmarks.common.write_results") and not _module_exists("tools.nope")
    assert len(_sources()) > 100
    doc, code = ROOT / "docs" / "x.md", ROOT / "codegen" / "x.py"
    line = "see codegen/gone.py, [a](decode.md), [b](gone.md), `python -m tools.gone`, docs/."
    assert _dead_in_line(line, doc) == ["codegen/gone.py", "gone.md", "tools.gone"]
    assert _dead_in_line("# (benchmarks/results/*_gemm_*.md; tools/ptx_audit.py)", code) == []


def _pending(where: str, name: str) -> bool:
    return name in PENDING and where.startswith(PENDING_IN)


def test_no_dead_paths_in_docs_and_comments():
    dead = {k: w for k, w in _dead().items() if not _pending(*k)}
    assert not dead, "\n".join(
        f"{n}: named at {', '.join(w[:4])}" for (_, n), w in sorted(dead.items())
    )


def test_pending_entries_are_still_dead():
    """Each PENDING name is still named, dead, somewhere (fixed ones leave the list)."""
    named = {n for (where, n) in _dead() if _pending(where, n)}
    assert not set(PENDING) - named, f"fixed, remove from PENDING: {set(PENDING) - named}"
