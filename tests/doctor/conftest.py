"""Fixtures of the doctor's tests: a throwaway interpreter (``--python``) whose site-packages hold a fake vLLM,
and the current line's patched tree of the real release."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from vllm_patch.infrastructure.downloads import pinned_base_tree
from vllm_patch.lines import line_for
from vllm_trees import PROJECT, patched_copy

VERSION = "0.33.0"


@pytest.fixture
def fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """(python, its site-packages): a virtual environment (no pip) that also sees this interpreter's packages
    (torch, Triton) through a .pth file, after its own."""
    root = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site


@pytest.fixture(scope="module")
def patched_v033(tmp_path_factory) -> Path:
    """A copy of vLLM 0.33.0's sdist tree with the current line applied (the sdist cached by the tool)."""
    series = line_for(PROJECT, VERSION).load()
    return patched_copy(pinned_base_tree(series.pin, quiet=True), tmp_path_factory.mktemp("v033"), series=series)
