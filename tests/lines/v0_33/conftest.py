"""The tests of the line pinned to vLLM 0.33.0 (the current line, the top-level series): its patches against
0.33.0's own files, on CPU (Triton interpreted).

``v033_pristine_tree`` is the 0.33.0 sdist (downloaded once, cached); ``v033_tree`` a copy of it with the line's
series applied through the tool. ``$VLLM_PATCH_V033_TREE`` names another tree to test instead: pointing it at
the pristine tree shows which tests the line makes pass (``$VLLM_PATCH_V033_PRISTINE_TREE`` likewise for the
release). A patch's ``Obsolete-If: test`` check runs these tests on a newer release's unpatched tree, which
the tool names in ``$VLLM_PATCH_BASE_UNDER_TEST``: ``v033_tree`` is then that tree.

The lines that carry these fixes to earlier releases (``CARRIED``) run the same tests in the same process, each
on its own pinned release with that line applied: every test here is parametrized by the line (``[current]``,
``[v0.32]``, ...), the carried lines' runs marked ``slow`` (the full tier). ``$VLLM_PATCH_V033_LINE`` names one
line to run alone; a tree named by the variables above is tested alone, under the test's plain id, as an
``Obsolete-If: test`` check names it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HERE = Path(__file__).parent

from vllm_patch.infrastructure.downloads import pinned_base_tree  # noqa: E402
from vllm_patch.lines import CURRENT, line_for, line_named  # noqa: E402
from vllm_patch.series import Series  # noqa: E402
from vllm_trees import PROJECT, patched_copy, tree_from_env  # noqa: E402

VERSION = "0.33.0"


# The lines whose patches are the current line's, rebased onto an earlier release.
CARRIED = ("v0.32", "v0.27", "v0.25")
LINE_ENV = "VLLM_PATCH_V033_LINE"
TREE_ENVS = ("VLLM_PATCH_V033_TREE", "VLLM_PATCH_V033_PRISTINE_TREE", "VLLM_PATCH_BASE_UNDER_TEST")


def lines_under_test() -> list[str] | None:
    """The lines to parametrize by, or None where one tree or one line is named (the tests keep their ids)."""
    if os.environ.get(LINE_ENV) or any(os.environ.get(var) for var in TREE_ENVS):
        return None
    return [CURRENT, *CARRIED]


def pytest_generate_tests(metafunc):
    lines = lines_under_test()
    if lines is not None and "v033_line" in metafunc.fixturenames:
        metafunc.parametrize("v033_line", [pytest.param(line, marks=() if line == CURRENT else pytest.mark.slow)
                                           for line in lines], indirect=True, scope="session")


@pytest.fixture(scope="session")
def v033_line(request) -> str | None:
    """The line these tests run for (parametrized), or $VLLM_PATCH_V033_LINE, or None: the line pinned to
    VERSION."""
    return getattr(request, "param", None) or os.environ.get(LINE_ENV) or None


@pytest.fixture(scope="session")
def v033_series(v033_line: str | None) -> Series:
    """The series of the line pinned to VERSION (these tests read 0.33.0's files), wherever it lives, or of the
    carried line under test."""
    if v033_line and v033_line != CURRENT:
        return line_named(PROJECT, v033_line).load()
    return line_for(PROJECT, VERSION).load()


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
