"""Every patch of every line keeps its header short: a summary of at most 20 lines between the
Subject and the DEP-3 trailers; the analysis (measurements, reasoning) lives in that patch's
section of the line's NOTES (``patches/NOTES.md``, ``lines/<name>/NOTES.md``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_patch.engine.patchfile import RE_TRAILER, parse_patch

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 20
PATCHES = sorted([*ROOT.glob("patches/*.patch"), *ROOT.glob("lines/*/patches/*.patch")])


def body_lines(description: str) -> list[str]:
    """The description's lines before its first trailer (trailers sit in its last paragraph)."""
    paragraphs = description.strip("\n").split("\n\n")
    last = paragraphs[-1].splitlines()
    first = next((i for i, line in enumerate(last) if RE_TRAILER.match(line.strip())), len(last))
    return "\n\n".join([*paragraphs[:-1], "\n".join(last[:first])]).strip("\n").splitlines()


def test_the_lines_have_patches():
    # The patch files of every line: those a line carries from another (`NAME from LINE`) are that line's.
    assert len(PATCHES) >= 30, PATCHES


def test_body_lines_stop_at_the_first_trailer():
    text = "Fixes a thing.\n\nMore words.\n\nOrigin: vendor\nBug: https://example.org/1"
    assert body_lines(text) == ["Fixes a thing.", "", "More words."]


@pytest.mark.parametrize("path", PATCHES, ids=[str(p.relative_to(ROOT)) for p in PATCHES])
def test_a_patch_header_is_a_summary_of_at_most_20_lines(path):
    patch = parse_patch(path.name, path.read_bytes())
    assert patch.trailers, f"{path}: no trailers"
    n = len(body_lines(patch.description))
    assert n <= LIMIT, f"{path}: {n} header lines before the trailers (at most {LIMIT}): move the analysis to NOTES"
