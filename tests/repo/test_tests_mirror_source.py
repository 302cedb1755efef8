"""tests/ mirrors the source tree folder for folder: a reader finds the tests of
`rl/train/trainer.py` under tests/rl/train/, those of `fp4_compile/rollout/` under tests/rollout/
and those of the package's root modules (recipe, format, reference, backend, ...) under
tests/core/. Checked on the tree (exact): no test file at the tests/ root or at tests/rl/'s root
(a new one fails here: put it in the folder of what it tests), every folder holding tests maps
to a source folder or is one of the tiers beside them, and test file names are unique (tests/
has no __init__.py: pytest imports each test module by its name)."""

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# tests/<folder> -> the source folder it mirrors (subfolders mirror its subfolders)
MIRRORS = {
    "core": "fp4_compile",
    "rollout": "fp4_compile/rollout",
    "checkpoints": "fp4_compile/checkpoints",
    "vllm_plugin": "fp4_compile/vllm_plugin",
    "integrations": "fp4_compile/integrations",
    "cost": "fp4_compile/cost",
    "passes": "passes",
    "codegen": "codegen",
    "rl": "rl",
    "benchmarks": "benchmarks",
    "tools": "tools",
}
# folders beside the mirror: the GPU tier (`pytest -m gpu`) and the checks on the repository as
# a whole (import rules, doc paths, cited results, packaging, this layout)
TIERS = {"gpu", "repo"}


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def test_the_scan_finds_the_tests():
    files = {p.relative_to(TESTS).as_posix() for p in _test_files()}
    assert {"repo/test_tests_mirror_source.py", "core/test_recipe.py"} <= files
    assert len(files) > 100


def test_no_test_file_at_the_root():
    stray = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not stray, f"test files at the tests/ root (move each beside what it tests): {stray}"


def test_no_test_file_at_the_rl_root():
    stray = sorted(p.name for p in (TESTS / "rl").glob("test_*.py"))
    assert not stray, f"tests/rl/ mirrors rl/ (train/, tasks/, diagnostics/, cli/): {stray}"


def test_every_test_folder_mirrors_a_source_folder():
    bad = []
    for folder in sorted({p.parent.relative_to(TESTS) for p in _test_files()}):
        top, *rest = folder.parts
        if top in TIERS:
            continue
        if top not in MIRRORS or not (ROOT / MIRRORS[top]).joinpath(*rest).is_dir():
            bad.append(folder.as_posix())
    assert not bad, f"folders of tests/ that mirror no source folder: {bad}"


def test_test_file_names_are_unique():
    counts = Counter(p.name for p in _test_files())
    assert not [n for n, c in counts.items() if c > 1], counts.most_common(3)
