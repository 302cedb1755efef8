"""The house rules for imports, checked on the source (no imports executed).

- No import cycles inside the package, counting imports inside functions (a lazy import that
  closes a loop is still a loop).
- No private name (`_name`) imported from another module of the package.
- One direction: codegen/ and passes/ never import the rollout runtime or rl/; the rollout
  runtime (fp4_compile/rollout/) and the checkpoint formats (fp4_compile/checkpoints/) never
  import rl/; the vLLM plugin (fp4_compile/vllm_plugin/) never imports rl/; the core imports rl/
  only from the CLI.
- passes/ is graph code, reached from outside only through its entry (`fp4_compile.passes`,
  the names of its `__all__`); the weight policy is core (`fp4_compile/weight_policy.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# root folder -> import package (pyproject's package-dir mapping)
FOLDERS = {
    "fp4_compile": "fp4_compile",
    "passes": "fp4_compile.passes",
    "codegen": "fp4_compile.codegen",
    "rl": "fp4_compile.rl",
}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join([package, *parts])
            out[name] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in module `name`."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
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
    return [f for f in found if f[0] == "fp4_compile" or f[0].startswith("fp4_compile.")]


def _target(module: str, name: str | None) -> str | None:
    """The package module an import reaches (`from pkg import submodule` reaches the submodule)."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module if module in MODULES else None


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name in MODULES:
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


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_private_names_imported_across_modules():
    bad = [
        f"{MODULES[name].relative_to(ROOT)}:{line} imports {imported} from {module}"
        for name in MODULES
        for module, imported, line in _imports(name)
        if imported
        and imported.startswith("_")
        and not (imported.startswith("__") and imported.endswith("__"))
        and f"{module}.{imported}" not in MODULES
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
    pass's module. The weight policy (which GEMMs are NVFP4, their groups, their bytes) is the
    numerics contract and lives beside the recipe, in `fp4_compile/weight_policy.py`."""
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
    policy = {"gemm_precision", "quantize_weight_bytes", "shared_scale_groups"}
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
