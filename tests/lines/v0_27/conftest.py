"""The tests of line v0.27 (lines/v0.27, pinned to vLLM 0.27.1) that the current line's tests (tests/lines/v0_33,
run on this line with ``VLLM_PATCH_V033_LINE=v0.27``) do not cover: the patches this line alone carries.

``v027_pristine_tree`` is the 0.27.1 sdist (downloaded once, cached); ``v027_tree`` a copy of it with the line
applied through the tool. ``$VLLM_PATCH_V027_TREE`` names another tree to test instead (the pristine one shows
which tests the line makes pass; ``$VLLM_PATCH_V027_PRISTINE_TREE`` likewise for the release). A patch's
``Obsolete-If: test`` check runs these tests on a newer release's unpatched tree, which the tool names in
``$VLLM_PATCH_BASE_UNDER_TEST``: ``v027_tree`` is then that tree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vllm_patch.infrastructure.downloads import pinned_base_tree
from vllm_patch.lines import line_named
from vllm_patch.series import Series
from vllm_trees import PROJECT, patched_copy, tree_from_env

HERE = Path(__file__).parent
# tq_harness (tests/lines/v0_33).
sys.path.insert(0, str(HERE.parent / "v0_33"))

LINE = "v0.27"


@pytest.fixture(scope="session")
def v027_series() -> Series:
    return line_named(PROJECT, LINE).load()


@pytest.fixture(scope="session")
def v027_pristine_tree(v027_series: Series) -> Path:
    """$VLLM_PATCH_V027_PRISTINE_TREE, else the line's pinned sdist."""
    return tree_from_env("VLLM_PATCH_V027_PRISTINE_TREE") or pinned_base_tree(v027_series.pin, quiet=True)


@pytest.fixture(scope="session")
def v027_tree(v027_pristine_tree: Path, v027_series: Series, tmp_path_factory) -> Path:
    """$VLLM_PATCH_V027_TREE, else $VLLM_PATCH_BASE_UNDER_TEST, else a copy of the release's vllm/ with the line
    applied (all or nothing)."""
    chosen = tree_from_env("VLLM_PATCH_V027_TREE") or tree_from_env("VLLM_PATCH_BASE_UNDER_TEST")
    if chosen is not None:
        return chosen
    return patched_copy(v027_pristine_tree, tmp_path_factory.mktemp("v027-patched"), series=v027_series)
