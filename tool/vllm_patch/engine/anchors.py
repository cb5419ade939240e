"""Find a hunk's anchor: a contiguous block of exact lines, wherever it occurs."""

from __future__ import annotations

import difflib
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


def nearest_block(lines: Sequence[str], block: Sequence[str], cutoff: float = 0.6) -> tuple[int, float] | None:
    """The 0-based start of the run of ``len(block)`` lines most like `block` (difflib's
    ratio over whole lines) and that ratio, or None when nothing reaches `cutoff`.
    Only for messages: placement never uses it."""
    n = len(block)
    if not n or not lines:
        return None
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(list(block))
    best: tuple[int, float] | None = None
    for i in range(max(1, len(lines) - n + 1)):
        matcher.set_seq1(list(lines[i:i + n]))
        floor = best[1] if best else cutoff
        if matcher.quick_ratio() < floor:
            continue
        ratio = matcher.ratio()
        if ratio >= floor and (best is None or ratio > best[1]):
            best = (i, ratio)
    return best


def why_missing(lines: Sequence[str], block: Sequence[str]) -> str:
    """What stands where `block` was expected, for a message: the nearest similar text and its
    first line that differs from the block, or that there is none."""
    near = nearest_block(lines, block)
    if near is None:
        return f"none of its {len(block)} context and removed lines are there as a block, and no similar text either"
    at, ratio = near
    diff = next(((k, line) for k, line in enumerate(lines[at:at + len(block)]) if line != block[k]), None)
    detail = f"; line {at + 1 + diff[0]} there reads {_shown(diff[1])} where the hunk expects " \
             f"{_shown(block[diff[0]])}" if diff else ""
    return f"the nearest similar text ({ratio:.0%} alike) starts at line {at + 1}{detail}"


def _shown(line: str, width: int = 100) -> str:
    text = line.rstrip("\r\n")
    return repr(text if len(text) <= width else text[:width] + "...")
