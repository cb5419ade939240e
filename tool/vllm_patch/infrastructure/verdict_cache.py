"""Verdicts of ``Obsolete-If: test`` checks, kept by what decides them.

Running a project test on an unpatched tree costs a new interpreter, torch and the tree's kernels under
Triton's interpreter: about two minutes a tree for the current line's checks. The verdict depends only on the
tree's files, the project's test code (and the tool it imports) and the Python environment, so it is stored
under ``<cache>/verdicts/`` keyed by a digest of exactly those; any change to one of them is a miss, and the
test runs again. Only verdicts are stored (passed or failed), never a run that could not give one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from .downloads import cache_root

ENV_OFF = "VLLM_PATCH_NO_VERDICT_CACHE"  # set (to anything but "" or "0"): every check runs its test again
# The distributions whose version can change a test's outcome besides the project's own files.
STACK = ("torch", "triton", "numpy", "pytest")
VERSION = 1


def _files_digest(root: Path, patterns: tuple[str, ...], skip: Callable[[Path], bool] = lambda rel: False) -> str:
    h = hashlib.sha256()
    for path in sorted(p for pattern in patterns for p in root.rglob(pattern) if p.is_file()):
        if "__pycache__" in path.parts or skip(path.relative_to(root)):
            continue
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


@lru_cache(maxsize=64)
def tree_digest(tree: Path) -> str:
    """Every file of the tree (an unpatched base: its content never changes under one path while we run)."""
    return _files_digest(tree, ("*",))


# Test folders no line's test imports (the tool's own, the virtualenv and GPU tooling's, the reports): a change
# there keeps every verdict. The project's top-level test files are left out too, save the one a check names.
# Besides tests/, line v0.20's tests import the GPU harness's model shapes: those files of gpu/harness, not the
# rest of the harness (the GPU runs' code, which changes with every GPU run and no line's test reads).
IMPORTED = ("gpu/harness/__init__.py", "gpu/harness/models.py")
UNRELATED = ("integration", "guard", "gpu", "gpu_fit", "benchmarks", "targets", "devtools", "doctor")


def _unrelated(rel: Path) -> bool:
    return (len(rel.parts) == 1 and rel.name.startswith("test_")) or any(
        rel.parts[: len(Path(u).parts)] == Path(u).parts for u in UNRELATED)


@lru_cache(maxsize=8)
def code_digest(project: Path) -> str:
    """The project's tests that a line's tests can import (code and the data they read) and the tool package
    they import, with the versions of the stack they run on."""
    h = hashlib.sha256(f"v{VERSION} {sys.version}".encode())
    h.update(_files_digest(project / "tests", ("*.py", "*.diff", "*.json", "*.txt"), _unrelated).encode())
    for rel in IMPORTED:
        path = project / rel
        h.update(rel.encode() + hashlib.sha256(path.read_bytes() if path.is_file() else b"").digest())
    pyproject = project / "pyproject.toml"  # the pytest settings
    h.update(hashlib.sha256(pyproject.read_bytes() if pyproject.is_file() else b"").digest())
    h.update(_files_digest(Path(__file__).resolve().parents[1], ("*.py",)).encode())
    for name in STACK:
        try:
            h.update(f"{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{name}=-".encode())
    return h.hexdigest()


def node_digest(project: Path, node: str) -> str:
    """The file (or folder) a check names, which code_digest may leave out."""
    path = project / node.split("::", 1)[0]
    if path.is_dir():
        return _files_digest(path, ("*.py",))
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"


class VerdictCache:
    """One JSON file a (tree, code, node) key: ``{"passed": bool, "detail": str}``."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_root() / "verdicts"
        self.enabled = os.environ.get(ENV_OFF, "") in ("", "0")

    def key(self, project: Path, tree: Path, node: str) -> str:
        return hashlib.sha256(f"{tree_digest(tree)}\0{code_digest(project)}\0{node}\0"
                              f"{node_digest(project, node)}".encode()).hexdigest()

    def get(self, key: str) -> tuple[bool, str] | None:
        if not self.enabled:
            return None
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
            return bool(data["passed"]), str(data["detail"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, verdict: tuple[bool, str]) -> None:
        """Written to a temporary file and renamed, so a reader never sees half a verdict; a cache that cannot
        be written costs the next run time, never a wrong answer."""
        if not self.enabled:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".verdict-")
            with os.fdopen(fd, "w") as fh:
                json.dump({"passed": verdict[0], "detail": verdict[1]}, fh)
            os.replace(tmp, self.root / f"{key}.json")
        except OSError:
            pass
