"""The README's line table says, for every vLLM release from 0.20.0 to 0.33.0, which line a target of it gets,
and for a release no line covers, the nearest covered releases: what the tool itself decides (lines.line_for,
lines.nearest)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_patch.errors import PinMismatch
from vllm_patch.lines import line_for, nearest

PROJECT = Path(__file__).resolve().parents[1]
# Every release of vLLM on PyPI from 0.20.0 to 0.33.0.
RELEASES = ("0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1",
            "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")


def _table() -> dict[str, tuple[str, str]]:
    """release -> (the line cell's name, or "none"; the proof cell), from the README's line table."""
    text = (PROJECT / "README.md").read_text()
    rows = text[text.index("| release | line | patches | proof |"):].split("\n\n", 1)[0].splitlines()[2:]
    table = {}
    for row in rows:
        release, line, _patches, proof = (c.strip() for c in row.strip("|").split(" | "))
        name = re.match(r"`([^`]+)`", line).group(1) if line != "none" else "none"
        for version in release.split(", "):
            table[version] = (name, proof)
    return table


def test_the_table_lists_every_release_once():
    assert sorted(_table(), key=lambda v: tuple(map(int, v.split(".")))) == list(RELEASES)


@pytest.mark.parametrize("version", RELEASES)
def test_each_row_says_what_the_tool_does(version):
    name, proof = _table()[version]
    if name == "none":
        with pytest.raises(PinMismatch):
            line_for(PROJECT, version)
        below_above = re.findall(r"(\d+\.\d+\.\d+) \(`([^`]+)`\)", proof)
        assert nearest(PROJECT, version) == ("the nearest releases a line covers are "
                                             + " and ".join(f"{v} (line {n})" for v, n in below_above))
    else:
        assert line_for(PROJECT, version).name == name
