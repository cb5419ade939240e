"""build-wheel chooses the release line as apply, status and revert do (`lines.choose_line`): by the
wheel's version, the releases a line declares with ``#: also`` included, and a wheel no line covers
is refused naming the nearest covered releases."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import build_series, edit
from test_lines import OLD_PIN, OLD_VERSION_PY, _declare, _repin
from test_wheel import make_wheel
from vllm_patch.cli import main
from vllm_patch.series import load_series


@pytest.fixture
def lined(tmp_path, base_files, two_patch_series) -> Path:
    """The current line (0.20.0, two patches) and lines/v0.19 (0.19.1, one other patch)."""
    root = tmp_path / "project"
    shutil.copytree(two_patch_series, root)
    old = build_series(root / "lines" / "v0.19", {**base_files, "vllm/_version.py": OLD_VERSION_PY}, [
        ("old fix", {"vllm/b.py": edit(base_files["vllm/b.py"], b"return 2\n", b"return 22\n")})])
    _repin(old, OLD_PIN)
    return root


def wheel_of(tmp_path, base_files, version: str):
    """A small vLLM wheel of `version`, its ``vllm/_version.py`` saying so too."""
    files = {**base_files, "vllm/_version.py": f"__version__ = version = '{version}'\n".encode()}
    return make_wheel(tmp_path / f"in-{version}", files, version=version)


def build(project, wheel, out, *before: str):
    return CliRunner().invoke(main, ["--series", str(project), *before, "build-wheel", "--from", str(wheel),
                                     "--out", str(out), "--json"])


def member(wheel, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name)


def test_a_wheel_of_an_older_line_gets_that_line(lined, tmp_path, base_files):
    wheel = wheel_of(tmp_path, {**base_files, "vllm/_version.py": OLD_VERSION_PY}, "0.19.1")
    done = build(lined, wheel, tmp_path / "dist")
    assert done.exit_code == 0, done.stderr
    data = json.loads(done.stdout)
    old = load_series(lined / "lines" / "v0.19")
    assert data["patches"] == list(old.names) and data["version"] == f"0.19.1+vp.{old.digest}"
    assert any("release line v0.19" in n for n in data["notes"])
    assert b"return 22" in member(data["wheel"], "vllm/b.py")


def test_a_release_the_line_declares_builds_with_and_without_line(lined, tmp_path, base_files):
    _declare(lined / "lines" / "v0.19", "0.19.0")
    wheel = wheel_of(tmp_path, base_files, "0.19.0")
    old = load_series(lined / "lines" / "v0.19")
    for i, before in enumerate(((), ("--line", "v0.19"))):
        done = build(lined, wheel, tmp_path / f"dist{i}", *before)
        assert done.exit_code == 0, done.stderr
        data = json.loads(done.stdout)
        assert data["version"] == f"0.19.0+vp.{old.digest}", data  # the wheel's release, not the pin's
        assert data["wheel"].endswith(f"vllm-0.19.0+vp.{old.digest}-cp38-abi3-linux_x86_64.whl")


def test_a_wheel_no_line_covers_names_the_nearest_releases(lined, tmp_path, base_files):
    wheel = wheel_of(tmp_path, base_files, "0.19.5")
    done = build(lined, wheel, tmp_path / "dist")
    assert done.exit_code == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rebase the series onto it first" not in errors[0], done.stderr
    assert ("the nearest releases a line covers are 0.19.1 (line v0.19) and 0.20.0 (line current)"
            in errors[0]), errors
    assert "--force" not in errors[0]  # build-wheel has no --force
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_line_names_a_line_that_does_not_cover_the_wheel(lined, tmp_path, base_files):
    wheel = wheel_of(tmp_path, base_files, "0.20.0")
    done = build(lined, wheel, tmp_path / "dist", "--line", "v0.19")
    assert done.exit_code == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "0.20.0" in errors[0] and "v0.19" in errors[0] and "0.19.1" in errors[0], errors
