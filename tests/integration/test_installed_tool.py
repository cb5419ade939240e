"""The tool as users install it: its own wheel (``pip wheel --no-deps .``) installed into a fresh
virtualenv with its dependencies, run from an empty directory, far from any checkout. The
release lines come bundled inside it: it shows the series, checks it on the pinned sdist and
applies it to a real vLLM 0.33.0 installed in a second virtualenv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from realvllm import make_venv
from vllm_patch import __version__
from vllm_patch.infrastructure.downloads import fetch
from vllm_patch.lines import CURRENT, line_named

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
# What a build reads: the package, its build step and the release lines (no build leftovers).
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".gpu", "tests",
                              "benchmarks", ".pytest_cache", ".ruff_cache")


@pytest.fixture(scope="module")
def tool(tmp_path_factory) -> Path:
    """`vllm-patch` of a fresh virtualenv holding the tool's own wheel (and its dependencies)."""
    work = tmp_path_factory.mktemp("tool")
    src = work / "src"
    shutil.copytree(PROJECT, src, ignore=SKIP)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                            str(src), "-w", str(work / "wheels")], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = list((work / "wheels").glob("vllm_patch-*.whl"))
    assert len(wheels) == 1, wheels
    python = make_venv(work / "venv", None)
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                str(wheels[0])], capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return python.parent / "vllm-patch"


@pytest.fixture(scope="module")
def vllm_python(tmp_path_factory) -> Path:
    """A second virtualenv with the real vLLM 0.33.0 wheel installed --no-deps (the current line's pin)."""
    wheel = fetch(line_named(PROJECT, CURRENT).load().pin.wheel, quiet=True)
    return make_venv(tmp_path_factory.mktemp("vllm") / "venv", wheel)


def run(tool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PATCH_SERIES", "VLLM_PATCH_LINE", "PYTHONPATH")}
    return subprocess.run([str(tool), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def test_the_installed_tool_checks_and_applies_from_anywhere(tool, vllm_python, tmp_path):
    empty = tmp_path / "anywhere"
    empty.mkdir()
    series = line_named(PROJECT, CURRENT).load()
    where = f"series {series.digest} bundled with vllm-patch {__version__}"

    shown = run(tool, "series", cwd=empty)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == where
    assert all(name in shown.stdout for name in series.names)

    checked = run(tool, "check", cwd=empty)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "vLLM found: 0.33.0 " in checked.stdout

    applied = run(tool, "apply", "--python", str(vllm_python), cwd=empty)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert where in applied.stdout

    status = run(tool, "status", "--python", str(vllm_python), "--expect", "applied", cwd=empty)
    assert status.returncode == 0, status.stdout + status.stderr
    assert where in status.stdout and "release line current" in status.stdout
    assert list(empty.iterdir()) == []
