from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import VERSION_PY, build_series, edit  # noqa: E402
from vllm_trees import patched_copy, pristine, tree_from_env  # noqa: E402

BASE = {
    "vllm/_version.py": VERSION_PY,
    "vllm/a.py": b"".join(f"line {i}\n".encode() for i in range(1, 41)),
    "vllm/b.py": b"def f():\n    return 1\n\n\ndef g():\n    return 2\n",
    "vllm/dup.py": b"x = 1\ny = 2\nz = 3\nq = 0\nx = 1\ny = 2\nz = 3\n",
}


# Fixtures holding the real release's trees: they download its sdist (once, cached).
REAL_TREES = {"pristine_tree", "patched_tree", "patch1_tree", "v033_pristine_tree", "v033_tree", "v027_pristine_tree",
              "v027_tree", "v025_pristine_tree", "v025_tree"}


# Fixtures that install a real vLLM wheel into a virtualenv: their tests are the full tier's (``slow``).
SLOW_FIXTURES = {"venv_python"}
# Set by devtools/patch_removal.py: only the tests that name this patch run.
JUDGED_ENV = "VLLM_PATCH_JUDGED_PATCH"


def names_patch(item: pytest.Item, name: str) -> bool:
    """Whether the test judges patch `name` (``@pytest.mark.patch(...)`` on it, its class or its module)."""
    return any(name in mark.args for mark in item.iter_markers("patch"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test on the real release's trees is an integration test, so ``-m "not integration"``
    never downloads anything. A test that fetches a tree by name at run time
    (``request.getfixturevalue``) is not seen here: its module marks itself. Under
    ``$VLLM_PATCH_JUDGED_PATCH`` only the tests that name that patch are kept."""
    for item in items:
        if REAL_TREES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    judged = os.environ.get(JUDGED_ENV)
    if judged:
        kept = [item for item in items if names_patch(item, judged)]
        config.hook.pytest_deselected(items=[item for item in items if not names_patch(item, judged)])
        items[:] = kept


@pytest.fixture
def base_files() -> dict[str, bytes]:
    return dict(BASE)


@pytest.fixture
def tree(tmp_path: Path, base_files) -> Path:
    """A small synthetic vLLM tree."""
    root = tmp_path / "tree"
    for rel, data in base_files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def two_patch_series(tmp_path: Path, base_files) -> Path:
    """Two patches: one edits a.py and b.py and adds a new module, the next edits a.py again."""
    a1 = edit(base_files["vllm/a.py"], b"line 10\n", b"line 10 patched\n")
    b1 = edit(base_files["vllm/b.py"], b"return 1\n", b"return 11\n")
    a2 = edit(a1, b"line 30\n", b"line 30 patched\nline 30b added\n")
    return build_series(tmp_path / "series1", base_files, [
        ("first fix", {"vllm/a.py": a1, "vllm/b.py": b1, "vllm/new_kernel.py": b"KERNEL = 1\n"}),
        ("second fix", {"vllm/a.py": a2}),
    ])


@pytest.fixture(scope="session")
def pristine_tree() -> Path:
    """The pinned release of line v0.20 (0.20.0), as a tree (see vllm_trees)."""
    return pristine()


@pytest.fixture(scope="session")
def patched_tree(pristine_tree: Path, tmp_path_factory) -> Path:
    """$VLLM_PATCH_PATCHED_TREE, else a session copy of the pristine tree with line v0.20's whole series applied."""
    return tree_from_env("VLLM_PATCH_PATCHED_TREE") or patched_copy(pristine_tree, tmp_path_factory.mktemp("patched"))
