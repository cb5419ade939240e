"""The GPU-fit tests: the multi-query verify kernel compiled ahead of time for foreign GPU targets (see
docs/gpu-fit.md and fitmatrix.py).

The kernel file is the one a line's series ships: the series creates
``vllm/v1/attention/ops/triton_turboquant_verify.py``, so the tool's engine builds it from the patches alone
(no vLLM release tree, no download). ``$VLLM_PATCH_PATCHED_TREE`` (line v0.20) and ``$VLLM_PATCH_V033_TREE``
(the current line) name a patched tree to read it from instead, as for the other tests.

Line v0.20 runs with Triton 3.6.0 (the project's venv); the current line with Triton 3.8.0, from a venv of
its own made once under the cache directory (PyPI, so those tests are ``integration`` tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fitsupport import LINES, kernel_file, triton_python


@pytest.fixture(scope="session")
def kernel_v020(tmp_path_factory) -> Path:
    return kernel_file("v0.20", tmp_path_factory.mktemp("kernel-v0.20"))


@pytest.fixture(scope="session")
def kernel_current(tmp_path_factory) -> Path:
    return kernel_file("current", tmp_path_factory.mktemp("kernel-current"))


@pytest.fixture(scope="session")
def triton38_python() -> Path:
    return triton_python(LINES["current"][1])
