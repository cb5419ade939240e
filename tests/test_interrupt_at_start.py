"""Ctrl-C while the command starts (its imports of click, rich and the tool are most of a short run) gives
one line and exit 130, never a traceback, through both entry points: the console script's (as
pyproject.toml declares it) and ``python -m vllm_patch``. The SIGINT is sent from an import hook at a
chosen import, so each case is the same every run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
# The console script's entry point as pyproject.toml declares it ([project.scripts]).
SCRIPT = re.search(r'(?m)^vllm-patch = "([\w.]+:\w+)"$', (PROJECT / "pyproject.toml").read_text()).group(1)

# A process started in the background of a shell (`.ci/run &`) inherits SIGINT ignored, which the tool keeps
# (entry.py); the case here is a run started in a terminal, so the hook puts Python's own handler back first.
HOOK = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)

class InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAt())
sys.argv = ["vllm-patch", "--help"]
"""
# What pip's console-script wrapper runs, for the entry point pyproject.toml declares.
CONSOLE = "from {module} import {func}\nsys.exit({func}())\n"
DASH_M = "import runpy\nrunpy.run_module('vllm_patch', run_name='__main__', alter_sys=True)\n"


def started(module: str, entry: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HOOK.format(module=module) + entry], capture_output=True, text=True,
                          env={**os.environ, "VLLM_PATCH_DEBUG": ""}, timeout=120)


@pytest.mark.parametrize("module", ["click", "rich.console", "vllm_patch.cli", "vllm_patch.operations",
                                    "vllm_patch.engine.patchfile", "unidiff", "packaging.version"])
@pytest.mark.parametrize("how", ["console-script", "python -m"])
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(module, how):
    mod, func = SCRIPT.split(":")
    done = started(module, CONSOLE.format(module=mod, func=func) if how == "console-script" else DASH_M)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "interrupted" in done.stderr, done.stderr
    assert done.stdout == ""


def test_without_a_sigint_the_entry_points_run():
    mod, func = SCRIPT.split(":")
    for entry in (CONSOLE.format(module=mod, func=func), DASH_M):
        done = started("never-imported", entry)
        assert done.returncode == 0 and "Usage:" in done.stdout, done.stderr
