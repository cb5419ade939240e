"""Kernel tests: vLLM's Triton kernels against PyTorch references, on a GPU or on CPU under Triton's interpreter.

The vLLM sources come from two trees: the pristine pinned release and a copy with the project's series
applied (``$VLLM_PATCH_PRISTINE_TREE`` / ``$VLLM_PATCH_PATCHED_TREE`` name unpacked trees to use instead,
as the GPU host does).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch

# Without CUDA the kernels run on CPU under the interpreter; Triton reads this when a kernel is defined,
# so it is set before any kernel module is loaded.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from vllm_patch.operations import apply  # noqa: E402
from vllm_patch.series import load_series  # noqa: E402
from vllm_patch.targets.tree import TreeTarget  # noqa: E402
from vllm_patch.upstream import pinned_base_tree  # noqa: E402
from vllm_tree import interpreted  # noqa: E402

PROJECT = Path(__file__).resolve().parents[2]
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
    """A tree holding the pinned release's ``vllm/``: $VLLM_PATCH_PRISTINE_TREE, else the cached PyPI sdist."""
    return _tree_from_env("VLLM_PATCH_PRISTINE_TREE") or pinned_base_tree(load_series(PROJECT).pin, quiet=True)


@pytest.fixture(scope="session")
def patched_tree(pristine_tree: Path, tmp_path_factory) -> Path:
    """A tree with the whole series applied: $VLLM_PATCH_PATCHED_TREE, else a session copy of the
    pristine ``vllm/`` patched through the tool's own apply (all or nothing)."""
    given = _tree_from_env("VLLM_PATCH_PATCHED_TREE")
    if given is not None:
        return given
    series = load_series(PROJECT)
    root = tmp_path_factory.mktemp("patched-tree")
    shutil.copytree(pristine_tree / "vllm", root / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in series.touched_paths():  # files a patch touches outside vllm/ (none are needed to import)
        if not rel.startswith("vllm/") and (pristine_tree / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pristine_tree / rel, root / rel)
    apply(TreeTarget(root), series)
    return root
