"""Find a hunk's anchor: a contiguous block of exact lines, wherever it occurs."""

from __future__ import annotations

from collections.abc import Sequence


def find_block(lines: Sequence[str], block: Sequence[str]) -> list[int]:
    """Every 0-based index at which `block` occurs in `lines` (overlaps included)."""
    if not block:
        return []
    first, n = block[0], len(block)
    hits = []
    last = len(lines) - n
    i = 0
    while i <= last:
        try:
            i = lines.index(first, i, last + 1)  # type: ignore[call-arg]
        except ValueError:
            break
        if all(lines[i + k] == block[k] for k in range(1, n)):
            hits.append(i)
        i += 1
    return hits


def splice(lines: list[str], at: int, old_len: int, new: Sequence[str]) -> list[str]:
    """A copy of `lines` with ``lines[at:at+old_len]`` replaced by `new`."""
    return [*lines[:at], *new, *lines[at + old_len:]]
