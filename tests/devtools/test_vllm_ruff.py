"""devtools/vllm_ruff.py: the ruff version a vLLM release pins, and a file its style fails told apart from one it
passes (with the ruff of this environment, standing in for the pinned one the script installs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from vllm_ruff import failures, ruff_version

PRE_COMMIT = """repos:
- repo: https://github.com/astral-sh/ruff-pre-commit
  rev: v0.14.0
  hooks:
  - id: ruff-check
"""


def test_the_pinned_ruff_is_read_from_the_pre_commit_config(tmp_path):
    (tmp_path / ".pre-commit-config.yaml").write_text(PRE_COMMIT)
    assert ruff_version(tmp_path) == "0.14.0"
    (tmp_path / ".pre-commit-config.yaml").write_text("repos: []\n")
    with pytest.raises(SystemExit, match="names no ruff-pre-commit rev"):
        ruff_version(tmp_path)


def test_a_file_off_the_trees_style_is_told_apart(tmp_path):
    exe = shutil.which("ruff") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "ruff")
    (tmp_path / "pyproject.toml").write_text('[tool.ruff]\nline-length = 88\n[tool.ruff.lint]\nselect = ["E", "F"]\n')
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "good.py").write_text("x = max(1, 2)\n")
    (tmp_path / "vllm" / "long.py").write_text("x = max(\n    1, 2\n)\n")
    (tmp_path / "vllm" / "unused.py").write_text("import os\n")
    got = failures(Path(exe), tmp_path, ["vllm/good.py", "vllm/long.py", "vllm/unused.py", "vllm/gone.py", "a.md"])
    assert got == {"vllm/good.py": [], "vllm/long.py": ["format"], "vllm/unused.py": ["check"]}
