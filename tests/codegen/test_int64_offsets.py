"""The int64 offset rule of `codegen/runtime.py`, checked on the source of every kernel: each
`tl.program_id(...)` is widened to int64 where it is read, or its line says why it may stay int32
(`# int32 index: ...`, an index bounded by one row). An int32 program id times a stride wraps
past 2**31 elements (16,384 x 151,936 logits): CUDA's illegal memory access."""

import re
from pathlib import Path

import fp4_compile.codegen as codegen

ROOT = Path(codegen.__file__).parent
PROGRAM_ID = re.compile(r"tl\.program_id\(\d\)")
WIDENED = re.compile(r"\s*\.to\(\s*tl\.int64\s*\)")


def test_every_program_id_is_int64_or_says_why():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        for m in PROGRAM_ID.finditer(text):
            widened = WIDENED.match(text, m.end())
            line_no = text.count("\n", 0, m.start()) + 1
            line = text.splitlines()[line_no - 1]
            if not widened and "# int32 index:" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{line_no}: {line.strip()}")
    assert not offenders, "program ids used as int32 (codegen/runtime.py, Offsets):\n" + "\n".join(
        offenders
    )


def test_the_rule_is_checked_somewhere():
    """The check above reads real kernels (a glob that found nothing would pass vacuously)."""
    hits = sum(len(PROGRAM_ID.findall(p.read_text())) for p in ROOT.rglob("*_kernel.py"))
    assert hits >= 30
