"""The vLLM source trees the patch tests run on: the release line v0.20's pinned release (0.20.0) and copies of it
with that line's series applied. (The current line's tests, against 0.33.0, are in tests/lines/v0_33.)

``$VLLM_PATCH_PRISTINE_TREE`` and ``$VLLM_PATCH_PATCHED_TREE`` name unpacked trees to use instead (a GPU host
passes the wheel's trees). Pointing the patched one at the pristine tree shows which tests the series makes
pass.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from vllm_patch.infrastructure.downloads import pinned_base_tree
from vllm_patch.lines import line_named
from vllm_patch.operations import apply
from vllm_patch.series import Series
from vllm_patch.targets.tree import TreeTarget

PROJECT = Path(__file__).resolve().parents[2]
# The release line whose patches tests/lines/v0_20 tests.
LINE = "v0.20"


def line_series() -> Series:
    """The series of LINE (lines/v0.20)."""
    return line_named(PROJECT, LINE).load()


def tree_from_env(var: str) -> Path | None:
    """The tree ``$var`` names (it must hold ``vllm/``), or None when unset."""
    value = os.environ.get(var)
    if not value:
        return None
    root = Path(value).resolve()
    if not (root / "vllm").is_dir():
        raise pytest.UsageError(f"${var}={value} holds no vllm/ directory")
    return root


def pristine() -> Path:
    """$VLLM_PATCH_PRISTINE_TREE, else LINE's pinned release's PyPI sdist (downloaded once, cached)."""
    return tree_from_env("VLLM_PATCH_PRISTINE_TREE") or pinned_base_tree(line_series().pin, quiet=True)


def patched_copy(base: Path, dest: Path, upto: str | None = None, series: Series | None = None) -> Path:
    """dest holding a copy of base's ``vllm/`` with ``series`` (default LINE's) applied through the tool (all or
    nothing), up to and including the patch named ``upto`` when given. Files the series touches outside
    ``vllm/`` are copied too."""
    series = series or line_series()
    if upto is not None:
        series = dataclasses.replace(series, patches=series.patches[: series.names.index(upto) + 1])
    shutil.copytree(base / "vllm", dest / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in series.touched_paths():
        if not rel.startswith("vllm/") and (base / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(base / rel, dest / rel)
    apply(TreeTarget(dest), series)
    return dest



def obsolete_verdicts(series: Series, name: str, trees: dict[str, Path]) -> dict[str, object]:
    """Patch ``name``'s ``Obsolete-If: test`` checks run on each tree as ``outlook`` and ``rebase`` run them
    (the project's tests, ``$VLLM_PATCH_BASE_UNDER_TEST`` naming the tree): a verdict, or None where no part
    holds."""
    from vllm_patch.lifecycle.obsolete import Judge, conditions, project_test_runner

    patch = next(p for p in series.patches if p.name == name)
    conds = conditions(patch)
    assert conds and all(c.op == "test" for c in conds), f"{name}: {[c.source for c in conds]}"
    verdicts: dict[str, object] = {}
    for label, tree in trees.items():
        def read(paths, root=tree):
            return {p: (root / p).read_bytes() if (root / p).is_file() else None for p in paths}
        judge = Judge(read, project_test_runner(PROJECT, lambda t=tree: t))
        judge.prepare([patch])
        verdicts[label] = judge.judge(patch)
    return verdicts


def assert_needed_then_obsolete(series: Series, name: str, release: Path, line: Path) -> None:
    """A line's own patch: its checks call it still needed on its release and obsolete once its fix is there."""
    verdicts = obsolete_verdicts(series, name, {"release": release, "line": line})
    assert verdicts["release"] is None, f"{name} on {series.pin.version}: {verdicts['release'].describe()}"
    assert verdicts["line"] is not None and verdicts["line"].whole, \
        f"{name} with the line: {verdicts['line'].describe() if verdicts['line'] else 'no part holds'}"
