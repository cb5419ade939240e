"""GDN speculative-decoding state recovery (patches 0004 and 0005): the pristine and the patched tree."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from vllm_patch.operations import apply  # noqa: E402
from vllm_patch.series import load_series  # noqa: E402
from vllm_patch.targets.tree import TreeTarget  # noqa: E402
from vllm_patch.upstream import pinned_base_tree  # noqa: E402

PROJECT = Path(__file__).resolve().parents[2]


def _tree_from_env(var: str) -> Path | None:
    value = os.environ.get(var)
    if not value:
        return None
    root = Path(value).resolve()
    if not (root / "vllm").is_dir():
        raise pytest.UsageError(f"${var}={value} holds no vllm/ directory")
    return root


@pytest.fixture(scope="session")
def pristine_tree() -> Path:
    """The pinned release's tree: $VLLM_PATCH_PRISTINE_TREE, else the cached PyPI sdist."""
    return _tree_from_env("VLLM_PATCH_PRISTINE_TREE") or pinned_base_tree(load_series(PROJECT).pin, quiet=True)


@pytest.fixture(scope="session")
def patched_tree(pristine_tree: Path, tmp_path_factory) -> Path:
    """$VLLM_PATCH_PATCHED_TREE, else a session copy of the pristine ``vllm/`` with the series applied."""
    given = _tree_from_env("VLLM_PATCH_PATCHED_TREE")
    if given is not None:
        return given
    root = tmp_path_factory.mktemp("gdn-patched-tree")
    shutil.copytree(pristine_tree / "vllm", root / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    apply(TreeTarget(root), load_series(PROJECT))
    return root
