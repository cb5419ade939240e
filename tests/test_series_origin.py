"""Errors about the series say which series was used and why: a stray ``series`` + ``patches/`` in the
working directory (or a parent) is named as such, an explicit ``--series`` is not spoken of as a line
choice, and ``$VLLM_PATCH_SERIES`` is named when it chose the series."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from helpers import snapshot
from vllm_patch.cli import main


@pytest.fixture
def stray(tmp_path):
    """A directory with a malformed series (no pin) and a patches/ folder, as left lying around."""
    root = tmp_path / "work"
    (root / "patches").mkdir(parents=True)
    (root / "series").write_text("0001-x.patch\n")
    return root


def error_of(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("sub", ["", "deeper/down"])
def test_a_stray_series_in_the_working_directory_is_named_with_why(stray, tree, monkeypatch, sub):
    where = stray / sub
    where.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(where)
    monkeypatch.delenv("VLLM_PATCH_SERIES", raising=False)
    before = snapshot(tree)
    for args in (["status", "--target", str(tree)], ["apply", "--target", str(tree)], ["series"]):
        line = error_of(CliRunner().invoke(main, args))
        assert "the pin lacks" in line, line
        assert f"the series in {stray}" in line and "working directory" in line, line
        assert "bundled" in line and "--series DIR" in line, line
        assert "cannot choose a release line" not in line, line
    assert snapshot(tree) == before


def test_errors_about_an_explicit_series_do_not_speak_of_choosing_a_line(stray, tree, monkeypatch):
    monkeypatch.delenv("VLLM_PATCH_SERIES", raising=False)
    line = error_of(CliRunner().invoke(main, ["--series", str(stray), "status", "--target", str(tree)]))
    assert "the pin lacks" in line and str(stray) in line, line
    assert "choose" not in line and "release line" not in line, line


@pytest.mark.parametrize("broken", ["malformed", "missing"])
def test_an_error_from_the_environment_variable_names_it(stray, tree, tmp_path, monkeypatch, broken):
    chosen = stray if broken == "malformed" else tmp_path / "nowhere"
    monkeypatch.setenv("VLLM_PATCH_SERIES", str(chosen))
    for args in (["status", "--target", str(tree)], ["series"]):
        line = error_of(CliRunner().invoke(main, args))
        assert f"VLLM_PATCH_SERIES={chosen}" in line, line
        assert "choose" not in line, line
