"""Tests of line v0.25 (vLLM 0.25.1) that the current line's suite (tests/lines/v0_33, which also runs on 0.25.1
with ``VLLM_PATCH_V033_LINE=v0.25``) cannot express: 0.25.1-only plumbing of the line's patches.

``v025_pristine_tree`` is the 0.25.1 sdist (``$VLLM_PATCH_V025_PRISTINE_TREE`` another tree), ``v025_tree`` a
copy of it with line v0.25 applied (``$VLLM_PATCH_V025_TREE``, else ``$VLLM_PATCH_BASE_UNDER_TEST`` (an
``Obsolete-If: test`` check's tree), another tree: the pristine one shows which tests the line makes pass)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "v0_33"))  # tq_harness

from vllm_patch.infrastructure.downloads import pinned_base_tree  # noqa: E402
from vllm_patch.lines import line_named  # noqa: E402
from vllm_trees import PROJECT, patched_copy, tree_from_env  # noqa: E402

LINE = "v0.25"


@pytest.fixture(scope="session")
def v025_series():
    return line_named(PROJECT, LINE).load()


@pytest.fixture(scope="session")
def v025_pristine_tree(v025_series) -> Path:
    return tree_from_env("VLLM_PATCH_V025_PRISTINE_TREE") or pinned_base_tree(v025_series.pin, quiet=True)


@pytest.fixture(scope="session")
def v025_tree(v025_pristine_tree, v025_series, tmp_path_factory) -> Path:
    chosen = tree_from_env("VLLM_PATCH_V025_TREE") or tree_from_env("VLLM_PATCH_BASE_UNDER_TEST")
    if chosen is not None:
        return chosen
    return patched_copy(v025_pristine_tree, tmp_path_factory.mktemp("v025-patched"), series=v025_series)
