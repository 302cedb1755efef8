"""Packaging: one import package from four root folders, entry points, single registration."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sub", ["passes", "codegen", "rl"])
def test_subpackages_resolve_to_root_folders(sub):
    mod = importlib.import_module(f"fp4_compile.{sub}")
    assert Path(mod.__file__).resolve().parent == ROOT / sub


def test_core_resolves_to_root_folder():
    import fp4_compile

    assert Path(fp4_compile.__file__).resolve().parent == ROOT / "fp4_compile"


def test_import_twice_registers_nothing_twice():
    """A fresh interpreter imports everything, re-imports it, and no bare `passes`/`codegen`/`rl`
    module appears; the fp4_compile op namespace is the same list after a second import."""
    code = r"""
import importlib, sys, torch
mods = ["fp4_compile", "fp4_compile.rollout", "fp4_compile.passes", "fp4_compile.codegen", "fp4_compile.rl"]
for m in mods: importlib.import_module(m)
import pkgutil, fp4_compile
for pkg in mods[1:]:
    p = importlib.import_module(pkg)
    for info in pkgutil.iter_modules(p.__path__):
        importlib.import_module(f"{pkg}.{info.name}")
ops = lambda: sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("fp4_compile::"))
ops1 = ops()
first = {m: id(sys.modules[m]) for m in mods}
for m in mods: importlib.import_module(m)
assert first == {m: id(sys.modules[m]) for m in mods}
for bare in ("passes", "codegen", "rl"):
    assert bare not in sys.modules, f"bare module {bare!r} imported: double registration risk"
assert ops1 == ops()
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_core_import_does_not_import_triton():
    """`import fp4_compile` (the core) loads no Triton; importing the codegen package binds no
    Triton name in any fp4_compile module (kernel modules load lazily, inside launchers).
    torch.library itself may import triton when ops are registered: that is torch's import."""
    code = (
        "import sys, fp4_compile; core = 'triton' in sys.modules\n"
        "import fp4_compile.codegen, fp4_compile.passes\n"
        "bound = [n for n, m in list(sys.modules.items()) if n.startswith('fp4_compile') and m is not None "
        "and 'triton' in vars(m)]\n"
        "print(core, bound)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False []"


def test_entry_points_declared():
    eps = importlib.metadata.entry_points()
    backends = {e.name: e.value for e in eps.select(group="torch_dynamo_backends")}
    assert backends.get("minite") == "fp4_compile.backend:minite_backend"
    scripts = {e.name: e.value for e in eps.select(group="console_scripts")}
    assert scripts.get("minite") == "fp4_compile.cli:main"


def test_distribution_name():
    assert importlib.metadata.version("minite") == "0.1.0"
