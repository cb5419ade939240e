"""The guard's test bench: its build-time module, its wheel built from a copy of the repository, a virtualenv
with the real vLLM 0.33.0 wheel (``--no-deps``: no torch) and the guard, the tool run on it, and vLLM's
start (``vllm_start.py``) run by it. Shared by the tests and ``benchmarks/bench_guard.py``."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
GUARD = PROJECT / "guard"
START = Path(__file__).resolve().parent / "vllm_start.py"
RECORD = "vllm_patch.json"
PIP = ("-m", "pip", "--disable-pip-version-check")


def guard_setup():
    """``guard/setup.py`` as a module (its ``setup()`` runs only as ``__main__``): `lines_data` and the rest.
    It puts ``guard/src`` on sys.path, so ``vllm_patch_guard`` is then the source's."""
    spec = importlib.util.spec_from_file_location("vllm_patch_guard_setup", GUARD / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_repository(dest: Path) -> Path:
    """What the guard's build reads, copied: ``guard/`` (its sources), ``series``, ``patches/``, ``lines/``."""
    dest.mkdir(parents=True)
    shutil.copytree(GUARD, dest / "guard", ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "lines.json"))
    shutil.copy2(PROJECT / "series", dest / "series")
    shutil.copytree(PROJECT / "patches", dest / "patches")
    shutil.copytree(PROJECT / "lines", dest / "lines")
    return dest


def build_wheel(source: Path, out: Path) -> Path:
    """The guard's wheel, built by pip (setuptools in an isolated build environment) from `source`."""
    subprocess.run([sys.executable, *PIP, "wheel", "-q", "--no-deps", "-w", str(out), str(source)], check=True)
    (wheel,) = out.glob("vllm_patch_guard-*.whl")
    return wheel


def vllm_wheel() -> Path:
    """The real wheel the current line is pinned to (vLLM 0.33.0), downloaded once and cached, sha256-checked."""
    from vllm_patch.infrastructure.downloads import fetch
    from vllm_patch.lines import line_named

    return fetch(line_named(PROJECT, "current").load().pin.wheel, quiet=True)


def make_vllm_venv(dest: Path, guard_wheel: Path, wheel: Path | None = None) -> Path:
    """A virtualenv with the real vLLM wheel (default the pinned one; ``--no-deps``) and the guard; its
    interpreter."""
    sys.path.insert(0, str(PROJECT / "tests" / "support"))
    from realvllm import make_venv

    py = make_venv(dest, wheel or vllm_wheel())
    subprocess.run([str(py), *PIP, "install", "-q", "--no-deps", str(guard_wheel)], check=True)
    return py


def site_packages(py: Path) -> Path:
    out = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def dist_info(py: Path) -> Path:
    (found,) = site_packages(py).glob("vllm-*.dist-info")
    return found


def tool(*args: str) -> subprocess.CompletedProcess:
    """The tool of this checkout (the tests' own install), run in the project."""
    return subprocess.run([sys.executable, "-m", "vllm_patch", *args], cwd=PROJECT, capture_output=True, text=True)


def put(py: Path, series: Path | None = None) -> None:
    """Leave vLLM as the wheel installed it, then (given `series`) with that series applied by the tool."""
    if (dist_info(py) / RECORD).exists():
        done = tool("revert", "--python", str(py))
        assert done.returncode == 0, done.stdout + done.stderr
    if series is not None:
        done = tool("--series", str(series), "apply", "--python", str(py))
        assert done.returncode == 0, done.stdout + done.stderr


def start(py: Path, *args: str, env: dict[str, str] | None = None,
          plugins: str | None = "vllm_patch_guard") -> subprocess.CompletedProcess:
    """vLLM's start (its plugin loader) in `py`. `plugins` is vLLM's own ``VLLM_PLUGINS`` allowlist (None: every
    plugin, vLLM's own LoRA resolvers too, which fail to load here without their dependencies and say so)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_PATCH_GUARD", "VLLM_PLUGINS"))}
    if plugins is not None:
        base["VLLM_PLUGINS"] = plugins
    return subprocess.run([str(py), str(START), *args], env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=120)


def guard_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("vllm-patch-guard:")]
