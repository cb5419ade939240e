"""TurboQuant backend tests: the patched ``turboquant_attn.py`` read (source checks) and run (``tq_backend``).

Trees: the pinned release (``$VLLM_PATCH_PRISTINE_TREE`` or the cached sdist), the whole series applied
(``$VLLM_PATCH_PATCHED_TREE`` or a session copy patched by the tool), and the release with the series up to
patch 0001 only (always built here), to check that the first patch is a safe state on its own.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import torch

# Kernels run under Triton's interpreter without CUDA; set before any kernel module is loaded.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "kernels"))  # vllm_tree, references

from vllm_patch.operations import apply  # noqa: E402
from vllm_patch.series import load_series  # noqa: E402
from vllm_patch.targets.tree import TreeTarget  # noqa: E402
from vllm_patch.upstream import pinned_base_tree  # noqa: E402

PROJECT = HERE.parents[1]
PATCH1 = "0001-turboquant-capture-safe-continuation-prefill.patch"
BACKEND = "vllm/v1/attention/backends/turboquant_attn.py"


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _tree_from_env(var: str) -> Path | None:
    value = os.environ.get(var)
    if not value:
        return None
    root = Path(value).resolve()
    if not (root / "vllm").is_dir():
        raise pytest.UsageError(f"${var}={value} holds no vllm/ directory")
    return root


def _patched_copy(base: Path, dest: Path, upto: str | None) -> Path:
    series = load_series(PROJECT)
    if upto is not None:
        series = dataclasses.replace(series, patches=series.patches[: series.names.index(upto) + 1])
    shutil.copytree(base / "vllm", dest / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    apply(TreeTarget(dest), series)
    return dest


@pytest.fixture(scope="session")
def pristine_tree() -> Path:
    return _tree_from_env("VLLM_PATCH_PRISTINE_TREE") or pinned_base_tree(load_series(PROJECT).pin, quiet=True)


@pytest.fixture(scope="session")
def patched_tree(pristine_tree: Path, tmp_path_factory) -> Path:
    return _tree_from_env("VLLM_PATCH_PATCHED_TREE") or \
        _patched_copy(pristine_tree, tmp_path_factory.mktemp("tq-patched"), None)


@pytest.fixture(scope="session")
def patch1_tree(pristine_tree: Path, tmp_path_factory) -> Path:
    """The release plus the series up to and including patch 0001 (the TurboQuant capture fix alone)."""
    return _patched_copy(pristine_tree, tmp_path_factory.mktemp("tq-patch1"), PATCH1)
