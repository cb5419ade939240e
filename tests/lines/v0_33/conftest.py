"""The tests of the line pinned to vLLM 0.33.0 (the current line, the top-level series): its patches against
0.33.0's own files, on CPU (Triton interpreted).

``v033_pristine_tree`` is the 0.33.0 sdist (downloaded once, cached); ``v033_tree`` a copy of it with the line's
series applied through the tool. ``$VLLM_PATCH_V033_TREE`` names another tree to test instead: pointing it at
the pristine tree shows which tests the line makes pass (``$VLLM_PATCH_V033_PRISTINE_TREE`` likewise for the
release). A patch's ``Obsolete-If: test`` check runs these tests on a newer release's unpatched tree, which
the tool names in ``$VLLM_PATCH_BASE_UNDER_TEST``: ``v033_tree`` is then that tree.

``$VLLM_PATCH_V033_LINE`` names another line that carries these fixes to an earlier release (``v0.32``): the
tests then read that line's pinned release and apply that line (tests/integration/test_lines_real.py runs them
so for every such line).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "kernels"))  # vllm_tree

from vllm_patch.infrastructure.downloads import pinned_base_tree  # noqa: E402
from vllm_patch.lines import line_for, line_named  # noqa: E402
from vllm_patch.series import Series  # noqa: E402
from vllm_trees import PROJECT, patched_copy, tree_from_env  # noqa: E402

VERSION = "0.33.0"


@pytest.fixture(scope="session")
def v033_series() -> Series:
    """The series of the line pinned to VERSION (these tests read 0.33.0's files), wherever it lives, or the line
    $VLLM_PATCH_V033_LINE names."""
    other = os.environ.get("VLLM_PATCH_V033_LINE")
    return line_named(PROJECT, other).load() if other else line_for(PROJECT, VERSION).load()


@pytest.fixture(scope="session")
def v033_pristine_tree(v033_series: Series) -> Path:
    """$VLLM_PATCH_V033_PRISTINE_TREE, else the line's pinned sdist."""
    return tree_from_env("VLLM_PATCH_V033_PRISTINE_TREE") or pinned_base_tree(v033_series.pin, quiet=True)


@pytest.fixture(scope="session")
def v033_tree(v033_pristine_tree: Path, v033_series: Series, tmp_path_factory) -> Path:
    """$VLLM_PATCH_V033_TREE, else $VLLM_PATCH_BASE_UNDER_TEST (an obsolete check's new base), else a copy of
    the release's vllm/ with the line applied (all or nothing)."""
    chosen = tree_from_env("VLLM_PATCH_V033_TREE") or tree_from_env("VLLM_PATCH_BASE_UNDER_TEST")
    if chosen is not None:
        return chosen
    return patched_copy(v033_pristine_tree, tmp_path_factory.mktemp("v033-patched"), series=v033_series)
