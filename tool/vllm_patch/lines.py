"""Release lines: the top-level series tracks the current vLLM release; ``lines/NAME/``
(each with its own ``series`` and ``patches/``) keeps the series of older releases
maintained. A command on a target picks the line proven on the target's vLLM: its pin, or a
later release its series declares (``#: also = ...``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .engine.patchfile import check_path
from .errors import InputError, PinMismatch
from .series import CURRENT, LINES_DIR, PATCH_DIR, SERIES_FILE, Series, load_series

# The way past a release no line covers, for the commands that take --force.
FORCE_HINT = "pass --line NAME --force to use one anyway"


@dataclass(frozen=True)
class Line:
    """One release line: its name and the directory holding its series."""

    name: str
    root: Path

    def load(self) -> Series:
        return load_series(self.root)


def lines_of(project: Path) -> list[Line]:
    """The project's lines: the top-level one (``current``) first, then ``lines/*`` by name."""
    # exists(), not is_file(): a series that is no regular file is a line, refused when loaded.
    found = [Line(CURRENT, project)] if (project / SERIES_FILE).exists() else []
    base = project / LINES_DIR
    if base.is_dir():
        found += [Line(d.name, d) for d in sorted(base.iterdir())
                  if (d / SERIES_FILE).exists() and (d / PATCH_DIR).is_dir()]
    return found


def line_named(project: Path, name: str) -> Line:
    """The line `name` (``current`` is the top-level series); unknown names are an input error."""
    check_path("--line", name)
    for line in lines_of(project):
        if line.name == name:
            return line
    raise InputError(f"no release line {name!r} in {project}; there are: {describe(project)}")


def describe(project: Path) -> str:
    """The lines there are, with the releases each is proven on, for messages."""
    parts = []
    for line in lines_of(project):
        try:
            parts.append(f"{line.name} (vLLM {', '.join(line.load().pin.releases)})")
        except InputError:
            parts.append(f"{line.name} (unreadable)")
    return ", ".join(parts) or "none"


def line_for(project: Path, version: str | None, hint: str = FORCE_HINT) -> Line:
    """The line proven on vLLM `version` (its pin or a release its series declares with
    ``also``; local labels such as ``+vp.x`` aside). A line whose series cannot be read
    only matters when no other line covers `version`: then its error (naming the file) is
    raised, as the choice may have needed it. None matching is a PinMismatch naming the
    lines there are, the nearest covered releases, and `hint` (the way forward)."""
    unreadable: list[InputError] = []
    lines = lines_of(project)
    if version is not None:
        for line in lines:
            try:
                pin = line.load().pin
            except InputError as exc:
                unreadable.append(exc)
                continue
            if pin.covers(version):
                return line
    if unreadable and len(lines) == 1:  # a project of one series: no choice to speak of
        raise unreadable[0]
    if unreadable:
        raise InputError(f"cannot choose a release line for vLLM {version or '(unknown version)'}: "
                         f"{unreadable[0].message}")
    near = nearest(project, version)
    raise PinMismatch(f"no release line of this project is pinned to vLLM {version or '(unknown version)'}; "
                      + (f"{near}; " if near else "")
                      + f"there are: {describe(project)}" + (f"; {hint}" if hint else ""))


def nearest(project: Path, version: str | None) -> str:
    """What a user of an uncovered release can move to: the covered releases just below and just above
    `version`, each with its line ("" when `version` is unknown or not a version)."""
    try:
        wanted = Version(version or "")
    except InvalidVersion:
        return ""
    covered: list[tuple[Version, str, str]] = []
    for line in lines_of(project):
        try:
            releases = line.load().pin.releases
        except InputError:
            continue
        for release in releases:
            with contextlib.suppress(InvalidVersion):
                covered.append((Version(release), release, line.name))
    below = max((c for c in covered if c[0] < wanted), default=None)
    above = min((c for c in covered if c[0] > wanted), default=None)
    picks = [f"{c[1]} (line {c[2]})" for c in (below, above) if c is not None]
    if not picks:
        return ""
    if len(picks) == 1:
        return f"the nearest release a line covers is {picks[0]}"
    return f"the nearest releases a line covers are {picks[0]} and {picks[1]}"


def choose_line(project: Path, version: str | None, name: str | None = None, force: bool = False,
                what: str = "the target", hint: str = FORCE_HINT, unknown: str = "") -> tuple[Line, str | None]:
    """The line a command on `what` (a target, a wheel) of vLLM `version` uses, and a note saying
    why; the one rule for apply, revert, status and build-wheel. `name` (--line) wins. Else the
    line proven on `version`; none: a PinMismatch ending in `hint`, unless `force`, which takes
    the current line. A project of one line whose target's version is unknown gets that line
    (its pin check then says); of several, the PinMismatch says why it is unknown (`unknown`)."""
    if name:
        chosen = line_named(project, name)
        return chosen, f"release line {chosen.name} (chosen with --line)"
    lines = lines_of(project)
    if not lines:  # no series at all: loading it says so, naming the file
        return Line(CURRENT, project), None
    if len(lines) == 1 and version is None:
        return lines[0], None
    if version is None and not force:
        raise PinMismatch(f"cannot tell which vLLM {what} holds{f' ({unknown})' if unknown else ''}, so no "
                          f"release line can be chosen for it; there are: {describe(project)}"
                          + (f"; {hint}" if hint else ""))
    try:
        chosen = line_for(project, version, hint)
    except PinMismatch:
        if not force:
            raise
        return line_named(project, CURRENT), f"release line {CURRENT}: no line is pinned to vLLM {version} (--force)"
    if len(lines) == 1:
        return chosen, None
    return chosen, f"release line {chosen.name}, proven on vLLM {version} like {what}"
