"""The codegen house rules (issue 47), checked on the source: every family folder has its
`reference.py`, no module under codegen/ is longer than 350 lines, no launch constant (warps,
stages, tile sizes, program counts) is written outside `codegen/configs.py` (and the table it
re-exports, `codegen/launch_table.py`), and the codegen
tests sit in their family's folder. Contract: each test names every file that breaks its rule."""

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODEGEN = ROOT / "codegen"
FAMILIES = ("nvfp4", "invariant", "moe")
MAX_LINES = 350

# Files allowed past MAX_LINES for now, each with the reason (shrink this list, never grow it).
LONG_FILES_ALLOWED: set[str] = set()

# Names that match the launch-constant patterns but are not launch constants.
NOT_LAUNCH_CONSTANTS = {
    ("nvfp4/op_args.py", "BLOCK"),  # an op argument's position in its schema
    ("nvfp4/op_args.py", "BLOCK_SCALES"),  # an op argument's position in its schema
}

# A launch constant written as a literal: `num_warps=4`, `"num_stages": 3`, `BLOCK_R = 16`,
# `BLOCK_K=32 if interp else 128`, `block = 1024`, `PROGRAMS_PER_SM = 8`, ...
LAUNCH_LITERAL = [
    re.compile(r"\b(?P<name>num_warps|num_stages)\s*[:=]\s*\d"),
    re.compile(r"\b(?P<name>BLOCK(_[A-Z0-9]+)*)\s*=\s*\d"),
    re.compile(
        r"\b(?P<name>NUM_WARPS|NUM_STAGES|[A-Z_]*TILE[A-Z_]*|[A-Z_]*ELEMENTS"
        r"|[A-Z_]*PROGRAMS[A-Z_]*)\s*=\s*\d"
    ),
    re.compile(r"(?P<name>)(?<![\w.])\d+\s+if\s+(not\s+)?interp|\binterp\w*(\(\))?\s+else\s+\d"),
    re.compile(r"\b(?P<name>(block|warps|stages)(_[a-z0-9]+)*)\s*=\s*\d"),
    re.compile(r"\b(?P<name>(block_[a-z]|warps)\w*)\s*=\s*(min|max)\(\d"),
]


def _codegen_files():
    return sorted(p for p in CODEGEN.rglob("*.py") if "__pycache__" not in p.parts)


def _code_only(text: str) -> list[str]:
    """The source lines with comments and strings blanked, except a string that is one
    identifier (a dict key such as "num_warps"), which stays as that identifier."""
    lines = text.splitlines()
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for tok in reversed(tokens):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        keep = tok.string[1:-1] if re.fullmatch(r"[\"'][A-Za-z_]\w*[\"']", tok.string) else ""
        (r0, c0), (r1, c1) = tok.start, tok.end
        if r0 == r1:
            lines[r0 - 1] = lines[r0 - 1][:c0] + keep + lines[r0 - 1][c1:]
        else:
            lines[r0 - 1] = lines[r0 - 1][:c0]
            for r in range(r0, r1 - 1):
                lines[r] = ""
            lines[r1 - 1] = lines[r1 - 1][c1:]
    return lines


def launch_literals(path: Path) -> list[str]:
    """'file:line: code' for each launch constant written as a literal in `path`."""
    rel = path.relative_to(CODEGEN).as_posix()
    found = []
    for i, code in enumerate(_code_only(path.read_text()), 1):
        for pattern in LAUNCH_LITERAL:
            m = pattern.search(code)
            if m and (rel, m.group("name")) not in NOT_LAUNCH_CONSTANTS:
                found.append(f"codegen/{rel}:{i}: {code.strip()}")
                break
    return found


def test_every_family_has_a_reference_module():
    """Each codegen family folder holds its CPU references in `reference.py`."""
    missing = [f for f in FAMILIES if not (CODEGEN / f / "reference.py").is_file()]
    assert not missing, f"codegen families without reference.py: {missing}"


def test_no_codegen_module_is_over_350_lines():
    """Small single-purpose files: no module under codegen/ past 350 lines (allow-list aside)."""
    long = {
        p.relative_to(CODEGEN).as_posix(): n
        for p in _codegen_files()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    over = {f: n for f, n in long.items() if f not in LONG_FILES_ALLOWED}
    assert not over, f"codegen modules over {MAX_LINES} lines: {over}"


def test_no_launch_constant_outside_configs():
    """Every launch constant (warps, stages, tiles, program counts) is a row of
    `codegen/configs.py` or of its `LAUNCH` table (`codegen/launch_table.py`); kernels read it
    through `configs.pick` / `pick_launch`."""
    tables = ("configs.py", "launch_table.py")
    found = [hit for p in _codegen_files() if p.name not in tables for hit in launch_literals(p)]
    assert not found, "launch constants outside codegen/configs.py:\n" + "\n".join(found)


def _flags(source: str) -> bool:
    return any(p.search(line) for p in LAUNCH_LITERAL for line in _code_only(source))


def test_the_rule_finds_a_launch_constant():
    """The scan is not vacuous: each written form of a launch constant is found, and the same
    text in a comment or a docstring is not."""
    forms = [
        "k[grid](x, BLOCK_R=16)",
        "k[grid](x, num_warps=4)",
        'opts = {"num_warps": 4}',
        "BLOCK_T, BLOCK_C = 8, 256",
        "k[grid](x, BLOCK=64 if interp else 1024)",
        "k[grid](x, num_warps=8 if block_v >= 2048 else 1)",
        "    block = 1024",
        "PROGRAMS_PER_SM = 8",
        "block_d = min(256, d)",
    ]
    missed = [form for form in forms if not _flags(form)]
    assert not missed, f"launch constants the scan misses: {missed}"
    assert not _flags("x = 1  # num_warps=4\n"), "a comment"
    assert not _flags('"""BLOCK_R = 16 rows"""\n'), "a docstring"
    assert not _flags("y = torch.float32 if interp else x.dtype\n"), "a dtype choice"


def test_codegen_tests_mirror_the_families():
    """Tests of codegen/<family>/ live in tests/codegen/<family>/: none at the top level but
    this one."""
    top = sorted(p.name for p in (ROOT / "tests" / "codegen").glob("test_*.py"))
    assert top == ["test_layout.py"], f"codegen tests outside a family folder: {top}"
    for family in FAMILIES:
        assert list((ROOT / "tests" / "codegen" / family).glob("test_*.py")), family


# ---- the int64 offset rule of `codegen/runtime.py`, on the source of every kernel: each
# `tl.program_id(...)` is widened to int64 where it is read, or its line says why it may stay
# int32 (`# int32 index: ...`). An int32 program id times a stride wraps past 2**31 elements
# (16,384 x 151,936 logits): CUDA's illegal memory access.
PROGRAM_ID = re.compile(r"tl\.program_id\(\d\)")
WIDENED = re.compile(r"\s*\.to\(\s*tl\.int64\s*\)")


def test_every_program_id_is_int64_or_says_why():
    offenders = []
    for path in sorted(CODEGEN.rglob("*.py")):
        text = path.read_text()
        for m in PROGRAM_ID.finditer(text):
            widened = WIDENED.match(text, m.end())
            line_no = text.count("\n", 0, m.start()) + 1
            line = text.splitlines()[line_no - 1]
            if not widened and "# int32 index:" not in line:
                offenders.append(f"{path.relative_to(CODEGEN)}:{line_no}: {line.strip()}")
    assert not offenders, "program ids used as int32 (codegen/runtime.py, Offsets):\n" + "\n".join(
        offenders
    )


def test_the_rule_is_checked_somewhere():
    """The check above reads real kernels (a glob that found nothing would pass vacuously)."""
    hits = sum(len(PROGRAM_ID.findall(p.read_text())) for p in CODEGEN.rglob("*_kernel.py"))
    assert hits >= 30
