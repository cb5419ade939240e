"""Files a line adds whole that a newer line adds too: one text for all of them.

A line that carries a newer line's fix to its own release may need hunks of its own in the files the release has,
and still add a new file exactly as the newer line does (the multi-query kernel, added by 0003 in the current line
and lines v0.27 and v0.25). The file's text is then the newer line's patch of the same file name: ``vllm-patch
carry`` rewrites the older line's patch with it, and its ``--check`` (a test of the repository) fails while any
copy differs. A patch under another name keeps its own version of the file (line v0.20's 0007 adds an earlier
kernel). Pure: series in, findings out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .patchfile import FileDiff, Patch

if TYPE_CHECKING:  # the type only: the engine reads no series file
    from ..series import Series


@dataclass(frozen=True)
class CarriedFile:
    """A file `patch` adds whole that `source` (``LINE/PATCH``) adds too; `text` is the source's."""

    patch: str
    path: str
    source: str
    text: bytes
    same: bool


def added_text(diff: FileDiff) -> bytes:
    """The text of a file a patch adds whole."""
    return "".join(line for hunk in diff.hunks for line in hunk.post).encode("utf-8")


def carried_files(series: Series, newer: list[tuple[str, Series]]) -> list[CarriedFile]:
    """For each patch `series` holds as its own and each file it adds whole: the first of the `newer` lines
    (newest first) whose own patch of the same file name adds that file too."""
    found = []
    for patch in series.patches:
        if series.source_of(patch.name):
            continue
        for diff in patch.files:
            if diff.kind != "add":
                continue
            hit = _source(diff.path, patch.name, newer)
            if hit:
                line, source, text = hit
                found.append(CarriedFile(patch.name, diff.path, f"{line}/{source.name}", text,
                                         added_text(diff) == text))
    return found


def _source(path: str, name: str, newer: list[tuple[str, Series]]) -> tuple[str, Patch, bytes] | None:
    for line, other in newer:
        for patch in other.patches:
            if other.source_of(patch.name) or patch.name != name:
                continue
            for diff in patch.files:
                if diff.path == path and diff.kind == "add":
                    return line, patch, added_text(diff)
    return None
