"""TurboQuant backend tests: the patched ``turboquant_attn.py`` read (source checks) and run (``tq_backend``).

Trees (release line v0.20): its pinned release (``$VLLM_PATCH_PRISTINE_TREE`` or the cached 0.20.0 sdist), the
line's whole series applied (``$VLLM_PATCH_PATCHED_TREE`` or a session copy patched by the tool), and the release
with the series up to patch 0001 only (always built here), to check that the first patch is a safe state on its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

# Kernels run under Triton's interpreter without CUDA; set before any kernel module is loaded.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HERE = Path(__file__).resolve().parent

from vllm_trees import patched_copy  # noqa: E402

PATCH1 = "0001-turboquant-capture-safe-continuation-prefill.patch"
BACKEND = "vllm/v1/attention/backends/turboquant_attn.py"


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="session")
def patch1_tree(pristine_tree: Path, tmp_path_factory) -> Path:
    """The release plus the series up to and including patch 0001 (the TurboQuant capture fix alone)."""
    return patched_copy(pristine_tree, tmp_path_factory.mktemp("tq-patch1"), PATCH1)
