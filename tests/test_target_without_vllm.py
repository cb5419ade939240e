"""A target that holds no vLLM (an empty directory, a virtualenv's root, the ``vllm`` package itself) is
refused in one line that says what it is and what a target should be, whatever line is asked for; a
source tree without ``vllm/_version.py`` is said to be one, not "vLLM (unknown version)"."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import snapshot, write_tree
from vllm_patch.cli import main

PROJECT = Path(__file__).resolve().parents[1]  # several lines: a line must be chosen


def run(*args: str):
    return CliRunner().invoke(main, ["--series", str(PROJECT), *args])


def one_error(result) -> str:
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(errors) == 1 and errors[0].startswith("error: "), result.stderr
    assert result.stdout == "", result.stdout
    return errors[0]


def empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def venv_root(tmp_path: Path) -> Path:
    root = tmp_path / "venv"
    write_tree(root, {"pyvenv.cfg": b"home = /usr/bin\n", "bin/python": b"", "lib/python3.12/site-packages/x.py": b""})
    return root


def package(tmp_path: Path) -> Path:
    write_tree(tmp_path / "site", {"vllm/__init__.py": b"", "vllm/_version.py": b"__version__ = '0.33.0'\n"})
    return tmp_path / "site" / "vllm"


@pytest.mark.parametrize("make, what, advice", [
    (empty, "is an empty directory", None),
    (venv_root, "is a virtual environment's root", "--python {root}/bin/python"),
    (package, "is the vllm package itself", "--target {parent}"),
])
@pytest.mark.parametrize("args", [["status"], ["apply"], ["--line", "current", "status"],
                                  ["--line", "v0.20", "apply", "--force"], ["revert"]])
def test_a_target_without_vllm_says_what_it_is(tmp_path, make, what, advice, args):
    root = make(tmp_path)
    before = snapshot(tmp_path)
    line = one_error(run(*args, "--target", str(root)))
    assert what in line, line
    assert "unknown version" not in line and "--line NAME --force" not in line, line
    assert "a target is" in line and "vllm/" in line and "--python" in line, line
    if advice:
        assert advice.format(root=root, parent=root.parent) in line, line
    assert snapshot(tmp_path) == before


def test_a_source_tree_without_a_version_file_is_said_to_be_one(tmp_path):
    tree = tmp_path / "src"
    write_tree(tree, {"vllm/__init__.py": b"", "vllm/envs.py": b"X = 1\n"})
    line = one_error(run("status", "--target", str(tree)))
    assert "unknown version" not in line, line
    assert "no vllm/_version.py" in line and "--line NAME --force" in line, line
