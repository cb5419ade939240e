"""What the GPU-fit tests share: the kernel file a line ships, an interpreter with the line's Triton, and
fitmatrix.py run in it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1] / "tests" / "support"))  # vllm_trees (outside pytest too: run_full.py)

from fitmatrix import KERNEL_REL, cache_dir  # noqa: E402

from vllm_patch.engine.analysis import analyze  # noqa: E402
from vllm_patch.lines import line_named  # noqa: E402
from vllm_trees import PROJECT, tree_from_env  # noqa: E402

# line name -> (the tree variable that overrides it, the Triton version it runs with)
LINES = {"v0.20": ("VLLM_PATCH_PATCHED_TREE", "3.6.0"), "current": ("VLLM_PATCH_V033_TREE", "3.8.0")}


def kernel_from_series(line: str) -> bytes:
    """The kernel file as line's series creates it: its patches' diffs of that file, applied in order to
    nothing by the tool's engine."""
    series = line_named(PROJECT, line).load()
    patches = [p for p in series.patches if KERNEL_REL in p.paths]
    if not patches or next(f for f in patches[0].files if f.path == KERNEL_REL).kind != "add":
        raise pytest.UsageError(f"line {line}'s series does not create {KERNEL_REL}")
    only = [dataclasses.replace(p, files=tuple(f for f in p.files if f.path == KERNEL_REL)) for p in patches]
    analysis = analyze(only, {KERNEL_REL: None})
    data = analysis.patched.get(KERNEL_REL) if analysis.consistent else None
    if data is None:
        raise pytest.UsageError(f"line {line}'s patches of {KERNEL_REL} do not apply in order")
    return data


def kernel_file(line: str, dest: Path) -> Path:
    """A file holding line's kernel: from $VLLM_PATCH_PATCHED_TREE / $VLLM_PATCH_V033_TREE, else the series."""
    tree = tree_from_env(LINES[line][0])
    if tree is not None:
        return tree / KERNEL_REL
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "triton_turboquant_verify.py"
    path.write_bytes(kernel_from_series(line))
    return path




def triton_python(version: str) -> Path:
    """An interpreter with triton==version: this one when it has it, else a venv under the cache made once
    (``pip install triton==version``)."""
    import triton

    if triton.__version__ == version:
        return Path(sys.executable)
    venv = Path(os.environ.get("VLLM_PATCH_GPU_FIT_VENV") or cache_dir() / f"venv-triton-{version}")
    python = venv / "bin" / "python"
    if (venv / ".ready").is_file():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"triton=={version}"], check=True)
    (venv / ".ready").write_text(version + "\n")
    return python



def run_fitmatrix(python: Path, kernel: Path, out: Path, *args: str, timeout: int = 1800):
    """fitmatrix.py in a child interpreter (its own Triton, no TRITON_INTERPRET); returns (rc, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([str(python), str(HERE / "fitmatrix.py"), "--kernel", str(kernel), "--out", str(out),
                           *args], env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr
