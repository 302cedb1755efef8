"""The house rules for imports, checked on the source (no imports executed).

- No import cycles inside the package, benchmarks/ and tools/, counting imports inside functions
  (a lazy import that closes a loop is still a loop).
- No private name (`_name`) imported from another module of the package, benchmarks/ or tools/.
- The folders import one way (`ALLOWED`, a table without cycles): tools/ -> benchmarks/ -> the
  package, which imports neither; inside the package, each folder only the folders its row lists.
- One direction: codegen/ and passes/ never import the rollout runtime or rl/; the rollout
  runtime (fp4_compile/rollout/) and the checkpoint formats (fp4_compile/checkpoints/) never
  import rl/; the vLLM plugin (fp4_compile/vllm_plugin/) never imports rl/; the core imports rl/
  only from the CLI.
- passes/ is graph code, reached from outside only through its entry (`fp4_compile.passes`,
  the names of its `__all__`); the weight policy is core (`fp4_compile/weight_policy.py`).
- Imports sit at the top of the module; one inside a function says why on its line or the line
  above (`# lazy: <reason>`: an optional dependency, an import cost, or a cycle it breaks).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# root folder -> import package (pyproject's package-dir mapping)
FOLDERS = {
    "fp4_compile": "fp4_compile",
    "passes": "fp4_compile.passes",
    "codegen": "fp4_compile.codegen",
    "rl": "fp4_compile.rl",
}
# the commands beside the package (`python -m benchmarks.<name>`, `python -m tools.<name>`)
SCRIPT_FOLDERS = {"benchmarks": "benchmarks", "tools": "tools"}
TOPS = ("fp4_compile", *SCRIPT_FOLDERS)


def _modules(folders: dict[str, str] = FOLDERS) -> dict[str, Path]:
    out = {}
    for folder, package in folders.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join([package, *parts])
            out[name] = path
    return out


MODULES = _modules()  # the package
SCRIPTS = _modules(SCRIPT_FOLDERS)  # benchmarks/ and tools/
EVERY = {**MODULES, **SCRIPTS}


def _is_package(name: str) -> bool:
    return EVERY[name].name == "__init__.py"


def _imports(name: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in module `name` of the
    package, benchmarks/ or tools/ that reaches one of them."""
    tree = ast.parse(EVERY[name].read_text(), filename=str(EVERY[name]))
    base = name if _is_package(name) else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base.split(".")
                pkg = pkg[: len(pkg) - (node.level - 1)]
                module = ".".join(pkg + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                found.append((module, a.name, node.lineno))
    return [f for f in found if f[0].split(".")[0] in TOPS]


def _target(module: str, name: str | None) -> str | None:
    """The module an import reaches (`from pkg import submodule` reaches the submodule)."""
    if name is not None and f"{module}.{name}" in EVERY:
        return f"{module}.{name}"
    return module if module in EVERY else None


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name in EVERY:
        edges = {_target(m, n) for m, n, _ in _imports(name)}
        graph[name] = {e for e in edges if e is not None and e != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_rules_see_the_package():
    assert "fp4_compile.rollout.engine" in MODULES
    assert "fp4_compile.passes" in MODULES and _is_package("fp4_compile.passes")
    assert _graph()["fp4_compile.rl.train.trainer"], "the trainer's imports were not found"


def test_the_rules_see_benchmarks_and_tools():
    assert {"benchmarks.common", "benchmarks.step_cost", "tools.localize_gpu"} <= set(SCRIPTS)
    assert "benchmarks.common" in _graph()["tools.localize_gpu"]
    assert "fp4_compile.cost" in _graph()["benchmarks.step_cost"]


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_private_names_imported_across_modules():
    bad = [
        f"{EVERY[name].relative_to(ROOT)}:{line} imports {imported} from {module}"
        for name in EVERY
        for module, imported, line in _imports(name)
        if imported
        and imported.startswith("_")
        and not (imported.startswith("__") and imported.endswith("__"))
        and f"{module}.{imported}" not in EVERY
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "layer, forbidden",
    [
        ("fp4_compile.codegen", ("fp4_compile.rl", "fp4_compile.rollout")),
        ("fp4_compile.passes", ("fp4_compile.rl", "fp4_compile.rollout")),
        ("fp4_compile.rollout", ("fp4_compile.rl",)),
        ("fp4_compile.checkpoints", ("fp4_compile.rl", "fp4_compile.rollout")),
        ("fp4_compile.vllm_plugin", ("fp4_compile.rl",)),
    ],
)
def test_layers_import_one_way(layer, forbidden):
    bad = [
        f"{name}:{line} imports {module}"
        for name in MODULES
        if name == layer or name.startswith(layer + ".")
        for module, _, line in _imports(name)
        if any(module == f or module.startswith(f + ".") for f in forbidden)
    ]
    assert not bad, "\n".join(bad)


def test_core_imports_rl_only_from_the_cli():
    core = [n for n in MODULES if MODULES[n].parent == ROOT / "fp4_compile"]
    bad = [
        f"{name}:{line} imports {module}"
        for name in core
        if name != "fp4_compile.cli"
        for module, imported, line in _imports(name)
        if module.startswith("fp4_compile.rl") or (module == "fp4_compile" and imported == "rl")
    ]
    assert not bad, "\n".join(bad)


def _passes_entry() -> set[str]:
    """The names `passes/__init__.py` lists in `__all__`: the pipeline entry."""
    tree = ast.parse(MODULES["fp4_compile.passes"].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError("passes/__init__.py has no __all__")


def test_passes_are_reached_only_through_the_pipeline_entry():
    """passes/ is graph code: outside it, code imports `fp4_compile.passes` itself (the names in
    its `__all__`: the pipeline, its report, the exported program's weight binding), never a
    pass's module. The weight policy (which GEMMs are NVFP4, their groups, how they quantize) is
    the numerics contract and lives beside the recipe, in `fp4_compile/weight_policy.py`."""
    entry = _passes_entry()
    bad = [
        f"{MODULES[name].relative_to(ROOT)}:{line} imports {module}"
        + (f".{imported}" if imported else "")
        for name in MODULES
        if not (name == "fp4_compile.passes" or name.startswith("fp4_compile.passes."))
        for module, imported, line in _imports(name)
        if module.startswith("fp4_compile.passes.")
        or (module == "fp4_compile.passes" and imported not in entry)
    ]
    assert not bad, "\n".join(bad)


def test_weight_policy_is_core_not_graph_code():
    policy = {"gemm_precision", "shared_scale_groups", "weight_quantize_mode"}
    tree = ast.parse(MODULES["fp4_compile.weight_policy"].read_text())
    assert policy <= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    bad = [
        f"{MODULES[name].relative_to(ROOT)} defines {n.name}"
        for name in MODULES
        if name.startswith("fp4_compile.passes")
        for n in ast.walk(ast.parse(MODULES[name].read_text()))
        if isinstance(n, ast.FunctionDef) and n.name in policy
    ]
    assert not bad, "\n".join(bad)


# ---- the allowed directions between folders ------------------------------------------------
# A module's folder (`_layer`): the package's subfolders by name, rl/ by its four parts, the
# face (the package's __init__, re-exporting the API, and the `minite` commands: cli, demo), the
# entry (the root modules that compose the whole lowering: the backend runs the pass pipeline and
# hands its ops to Inductor, `compile` / `explain` drive it and bind the rollout's weight store,
# `testing.learner_weight_bytes` runs it; they sit above passes/, codegen/ and the rollout
# runtime, which never import them) and the core (every other module at the package root:
# recipe, format, reference, weight policy, compiler pins, ...).
FACE = {"fp4_compile", "fp4_compile.cli", "fp4_compile.demo"}
ENTRY = {"fp4_compile.backend", "fp4_compile.compile_api", "fp4_compile.testing"}
SUBFOLDERS = ("codegen", "passes", "rollout", "checkpoints", "vllm_plugin", "integrations", "cost")
# what each folder may import besides itself (one way: the table has no cycle)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "codegen": {"core"},
    "passes": {"core", "codegen"},
    "rollout": {"core", "codegen", "passes"},
    "checkpoints": {"core", "codegen"},
    "vllm_plugin": {"core", "codegen", "checkpoints", "rollout"},
    "rl.tasks": {"core"},
    "rl.diagnostics": {"core", "rollout"},
    "rl.train": {
        "core",
        "entry",
        "codegen",
        "passes",
        "rollout",
        "checkpoints",
        "vllm_plugin",
        "rl.tasks",
        "rl.diagnostics",
    },
    "rl.cli": {"core", "rollout", "checkpoints", "rl.tasks", "rl.diagnostics", "rl.train"},
    "rl": {"core", "rollout", "vllm_plugin", "rl.tasks", "rl.diagnostics", "rl.train", "rl.cli"},
    "integrations": {"core", "entry", "codegen", "rollout", "rl.diagnostics"},
    "cost": {"core", "entry", "codegen", "passes", "rollout"},  # it prices what the backend lowers
    "entry": {"core", "codegen", "passes", "rollout"},
}
PACKAGE_LAYERS = set(ALLOWED)
ALLOWED["face"] = PACKAGE_LAYERS - {"cost"}
ALLOWED["benchmarks"] = PACKAGE_LAYERS | {"face"}
ALLOWED["tools"] = PACKAGE_LAYERS | {"face", "benchmarks"}
# Imports against the table that exist today, each pair with the modules that make it (none
# since issue 55). A pair no module makes any more fails `test_pending_ties_still_exist`: delete it.
PENDING: dict[tuple[str, str], set[str]] = {}


def _layer(name: str) -> str:
    parts = name.split(".")
    if parts[0] in SCRIPT_FOLDERS:
        return parts[0]
    if name in FACE:
        return "face"
    if name in ENTRY:
        return "entry"
    if len(parts) > 1 and parts[1] in SUBFOLDERS:
        return parts[1]
    if len(parts) > 1 and parts[1] == "rl":
        return "rl" if len(parts) == 2 else f"rl.{parts[2]}"
    return "core"


def _layer_edges() -> dict[tuple[str, str], list[str]]:
    """(importing folder, imported folder) -> 'module:line' of each import between folders."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name in EVERY:
        for module, imported, line in _imports(name):
            target = _target(module, imported)
            if target is not None and _layer(target) != _layer(name):
                edges.setdefault((_layer(name), _layer(target)), []).append(f"{name}:{line}")
    return edges


def test_every_folder_has_a_row():
    assert {_layer(n) for n in EVERY} == set(ALLOWED)
    assert _layer("fp4_compile.backend") == "entry" and _layer("fp4_compile.cli") == "face"
    assert _layer("fp4_compile.weight_policy") == "core"
    assert (
        _layer("fp4_compile.rl.train.trainer") == "rl.train"
        and _layer("tools.ptx_audit") == "tools"
    )


def test_allowed_directions_are_one_way():
    """The table has no cycle: no two folders may import each other, directly or around."""
    graph = {layer: set(targets) for layer, targets in ALLOWED.items()}
    assert not _cycles(graph), f"ALLOWED has cycles: {_cycles(graph)}"


def test_folders_import_in_the_allowed_directions():
    bad = [
        f"{where} imports {b} ({a} may import {sorted(ALLOWED[a])})"
        for (a, b), found in sorted(_layer_edges().items())
        if b not in ALLOWED[a]
        for where in found
        if where.split(":")[0] not in PENDING.get((a, b), set())
    ]
    assert not bad, "\n".join(bad)


def test_pending_ties_still_exist():
    """Each PENDING module still imports against the table (a fixed one leaves the list)."""
    edges = _layer_edges()
    fixed = {
        (pair, module)
        for pair, modules in PENDING.items()
        for module in modules
        if not any(w.split(":")[0] == module for w in edges.get(pair, []))
    }
    assert not fixed, f"no longer imported against the table, remove from PENDING: {fixed}"


def test_the_package_imports_neither_benchmarks_nor_tools():
    bad = [
        f"{MODULES[name].relative_to(ROOT)}:{line} imports {module}"
        for name in MODULES
        for module, _, line in _imports(name)
        if module.split(".")[0] in SCRIPT_FOLDERS
    ]
    assert not bad, "\n".join(bad)


# ---- imports inside functions ----------------------------------------------------------------
LAZY = "# lazy:"
# imports inside functions without their reason yet, (file, imported module) each, in a file
# another change owns for now: give the reason (or move the import up), then delete the entry
LAZY_PENDING: set[tuple[str, str]] = set()


def _function_imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module as written, has a `# lazy:` reason) of each import inside a
    function of `path`: on the import's first line, or the comment line right above it."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for top in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(top):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if isinstance(node, ast.Import):
                    module = ", ".join(a.name for a in node.names)
                else:
                    module = "." * node.level + (node.module or "")
                above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                reason = LAZY in lines[node.lineno - 1] or above.startswith(LAZY)
                found.append((node.lineno, module, reason))
    return sorted(set(found))  # a nested function's imports are walked once per enclosing def


def _unreasoned() -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for path in MODULES.values():
        rel = path.relative_to(ROOT).as_posix()
        for line, module, reason in _function_imports(path):
            if not reason:
                out.setdefault((rel, module), []).append(line)
    return out


def test_the_lazy_rule_sees_imports_inside_functions():
    imports = _function_imports(MODULES["fp4_compile.codegen.invariant.attention"])
    assert imports and all(reason for _, _, reason in imports)
    assert any(m.endswith("_kernel") for _, m, _ in imports)


def test_imports_inside_functions_say_why():
    """An import inside a function of the package carries its reason, `# lazy: ...`, on its line
    or the line above (CONTRIBUTING.md, import rules): Triton, transformers, vLLM or another
    optional dependency; an import cost (Inductor, Dynamo, sympy, FSDP); a cycle it breaks. A
    cheap import that closes no cycle goes to the top of the module instead."""
    bad = [
        f"{rel}:{line} imports {module} inside a function without a `# lazy: <reason>` comment"
        for (rel, module), lines in sorted(_unreasoned().items())
        if (rel, module) not in LAZY_PENDING
        for line in lines
    ]
    assert not bad, "\n".join(bad)


def test_lazy_pending_entries_still_exist():
    fixed = LAZY_PENDING - set(_unreasoned())
    assert not fixed, f"these imports now say why or moved up, remove from LAZY_PENDING: {fixed}"
