"""Kernel tests: vLLM's Triton kernels against PyTorch references, on a GPU or on CPU under Triton's interpreter.

The vLLM sources come from two trees (the ``pristine_tree`` and ``patched_tree`` fixtures of tests/conftest.py):
release line v0.20's pinned release (0.20.0) and a copy with that line's series applied.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

# Without CUDA the kernels run on CPU under the interpreter; Triton reads this when a kernel is defined,
# so it is set before any kernel module is loaded.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy  # noqa: E402
import pytest  # noqa: E402

from vllm_tree import interpreted  # noqa: E402

INTERPRETED = interpreted()


def _numpy_breaks_interpreter() -> bool:
    # Triton 3.6's interpreter calls int() on 1-element arrays (scalar loads); NumPy 2.4 made that an error.
    major, minor = (int(p) for p in numpy.__version__.split(".")[:2])
    return INTERPRETED and (major, minor) >= (2, 4)


def pytest_collection_modifyitems(config, items):
    """Every test here is a ``kernels`` test; the interpreter's NumPy deprecation noise is hidden."""
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=f"numpy {numpy.__version__} breaks the Triton interpreter "
                                   "(int() of a 1-element array); install numpy<2.4")
    quiet = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
    for item in items:
        if here not in item.path.parents:
            continue
        item.add_marker(pytest.mark.kernels)
        if INTERPRETED:
            item.add_marker(quiet)
        if _numpy_breaks_interpreter():
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> str:
    """Where tensors live: "cuda" on a GPU host, else "cpu" (kernels interpreted)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
