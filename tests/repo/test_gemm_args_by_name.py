"""No NVFP4 GEMM argument tuple is built or read by position outside the call object
(`codegen/nvfp4/gemm_call.py`, `GemmCall`): checked on the source (no imports executed).

Scanned: the package's code folders (the four ops' own files included: they are registered from
`GemmCall`'s table and read their inputs by name; the step cost model's rules,
`fp4_compile/cost/rules.py`, read GEMM nodes). Tests build positional tuples on purpose
(opcheck) and are not scanned."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [ROOT / d for d in ("fp4_compile", "passes", "codegen", "rl")]
CALL_OBJECT = ROOT / "codegen" / "nvfp4" / "gemm_call.py"

_GEMM = r"nvfp4_(?:linear|grouped_mm)(?:_quantized)?"
RULES = {
    # the old positions class: the positions are GemmCall's alone
    "names a GEMM argument position (GemmArg)": re.compile(r"\bGemmArg\b"),
    # torch.ops.fp4_compile.nvfp4_linear(...), ops().nvfp4_grouped_mm.default(...)
    "calls a GEMM op with positional arguments": re.compile(
        rf"ops(?:\(\))?\.(?:fp4_compile\.)?{_GEMM}(?:\.default)?\s*\("
    ),
    # insert_call(graph, ops.nvfp4_linear.default, (x, ...)) and the like
    "passes a GEMM op an argument tuple (or lists overloads: use is_gemm)": re.compile(
        rf"\.{_GEMM}\.default\s*,"
    ),
    # n.args[8], X_INDEX_ARG = 10: the GEMMs' own positions (7 on: recipe, w_ongrid, site,
    # x_index, x_perm, x's operands; no other op of the scanned code reads that far)
    "reads a GEMM argument by its position": re.compile(
        r"\.args\[\s*(?:[7-9]|1[0-3])\s*\]|\b[A-Z_]+_ARG\s*=\s*\d+"
    ),
}


def _files() -> list[Path]:
    out = []
    for root in SCANNED:
        out += [root] if root.is_file() else sorted(root.rglob("*.py"))
    return [p for p in out if p != CALL_OBJECT]


def test_scan_sees_the_gemm_callers():
    files = set(_files())
    for name in (
        "passes/targets.py",
        "fp4_compile/vllm_plugin/quantization.py",
        "codegen/nvfp4/api.py",
        "codegen/nvfp4/linear.py",
        "fp4_compile/cost/rules.py",
    ):
        assert ROOT / name in files, name


def test_rules_catch_positional_gemm_calls():
    bad = [
        "args[GemmArg.NUMERICS]",
        "torch.ops.fp4_compile.nvfp4_linear(x, w, c, s, gd, None, None, key, None)",
        "insert_call(graph, _ops().nvfp4_grouped_mm_quantized.default, (*args, a), before=n)",
        "if len(n.args) <= 8 or n.args[8] is None:",
        "X_INDEX_ARG = 10  # of fp4_compile::nvfp4_grouped_mm",
    ]
    for line in bad:
        assert any(rule.search(line) for rule in RULES.values()), line
    good = ["GemmCall.of(node).site", "torch.ops.fp4_compile.nvfp4_linear_backward(g, x)"]
    for line in good:
        assert not any(rule.search(line) for rule in RULES.values()), line


def test_no_gemm_arguments_by_position_outside_the_call_object():
    found = []
    for path in _files():
        text = path.read_text()
        for what, rule in RULES.items():
            for m in rule.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line} {what}")
    assert not found, "build or read GEMM calls with GemmCall:\n" + "\n".join(found)
