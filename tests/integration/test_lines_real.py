"""Every release line checks against its own pinned release's sdist, and the current series also applies to the
later 0.20.x patch releases (the line's users upgrade within it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from vllm_patch.lines import lines_of
from vllm_patch.series import load_series

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("line", [line.name for line in lines_of(PROJECT)])
def test_each_line_checks_on_its_pinned_release(line):
    result = run_cli("--line", line, "check", cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    assert "apply cleanly" in result.stdout


def test_the_current_series_applies_to_the_later_0_20_releases():
    result = run_cli("outlook", "--releases", "0.20.1,0.20.2", "--json", cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    releases = {r["version"]: r for r in data["releases"]}
    assert set(releases) >= {"0.20.1", "0.20.2"}
    for version in ("0.20.1", "0.20.2"):
        states = {name: cell["stacked"]["state"] for name, cell in releases[version]["patches"].items()}
        assert len(states) == len(load_series(PROJECT).patches) and set(states.values()) == {"clean"}, (version, states)
