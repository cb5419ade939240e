"""One command, one path: cli.py parses options, calls operations and renders through report, so it imports
nothing of the lifecycle or infrastructure rooms (docs/maintaining.md#one-command-one-path). Read with ast, so
an import hidden inside a function counts too; offline, well under a second."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import vllm_patch

PACKAGE = Path(vllm_patch.__file__).resolve().parent
CLI = PACKAGE / "cli.py"
FORBIDDEN = ("vllm_patch.lifecycle", "vllm_patch.infrastructure")


def imported_modules(path: Path, package: str = "vllm_patch") -> list[tuple[int, str]]:
    """(line, module) for every import in `path`, relative ones resolved against `package`; for
    ``from X import a``, both X and X.a (a may be a submodule: ``from . import lifecycle``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def forbidden(modules: list[tuple[int, str]]) -> list[str]:
    return [f"line {line}: {name}" for line, name in modules
            if any(name == room or name.startswith(room + ".") for room in FORBIDDEN)]


def test_cli_imports_neither_lifecycle_nor_infrastructure():
    bad = forbidden(imported_modules(CLI))
    assert not bad, f"cli.py reaches past operations (route it through operations.py): {bad}"


def test_the_check_sees_relative_absolute_and_nested_imports(tmp_path):
    sample = tmp_path / "cli.py"
    sample.write_text("from .lifecycle.rebase import RebaseConflict\nfrom . import infrastructure\n"
                      "import vllm_patch.lifecycle.outlook\ndef f():\n    from .infrastructure import downloads\n"
                      "from . import operations, report\nfrom .doctor import render\n")
    assert [b.split(": ")[1] for b in forbidden(imported_modules(sample))] == [
        "vllm_patch.lifecycle.rebase", "vllm_patch.lifecycle.rebase.RebaseConflict", "vllm_patch.infrastructure",
        "vllm_patch.lifecycle.outlook", "vllm_patch.infrastructure", "vllm_patch.infrastructure.downloads"]


def test_starting_the_cli_loads_no_lifecycle_module():
    """The lifecycle room brings GitPython (tens of ms): only outlook, rebase and the authoring commands pay."""
    code = ("import sys, vllm_patch.cli; print(' '.join(m for m in sys.modules "
            "if m.startswith('vllm_patch.lifecycle') or m.split('.')[0] == 'git'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(PACKAGE.parent), "PATH": ""})
    assert done.stdout.split() == [], done.stdout
