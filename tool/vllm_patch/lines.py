"""Release lines: the top-level series tracks the current vLLM release; ``lines/NAME/``
(each with its own ``series`` and ``patches/``) keeps the series of older releases
maintained. A command on a target picks the line whose pin is the target's vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .engine.patchfile import check_path
from .errors import InputError, PinMismatch
from .series import PATCH_DIR, SERIES_FILE, Series, load_series

LINES_DIR = "lines"
CURRENT = "current"


@dataclass(frozen=True)
class Line:
    """One release line: its name and the directory holding its series."""

    name: str
    root: Path

    def load(self) -> Series:
        return load_series(self.root)


def lines_of(project: Path) -> list[Line]:
    """The project's lines: the top-level one (``current``) first, then ``lines/*`` by name."""
    found = [Line(CURRENT, project)] if (project / SERIES_FILE).is_file() else []
    base = project / LINES_DIR
    if base.is_dir():
        found += [Line(d.name, d) for d in sorted(base.iterdir())
                  if (d / SERIES_FILE).is_file() and (d / PATCH_DIR).is_dir()]
    return found


def project_of(series_root: Path) -> Path:
    """The project holding a series directory: a line's ``lines/NAME`` lies two levels down."""
    return series_root.parent.parent if series_root.parent.name == LINES_DIR else series_root


def line_named(project: Path, name: str) -> Line:
    """The line `name` (``current`` is the top-level series); unknown names are an input error."""
    check_path("--line", name)
    for line in lines_of(project):
        if line.name == name:
            return line
    raise InputError(f"no release line {name!r} in {project}; there are: {describe(project)}")


def describe(project: Path) -> str:
    """The lines there are, with their pinned releases, for messages."""
    parts = []
    for line in lines_of(project):
        try:
            parts.append(f"{line.name} (vLLM {line.load().pin.version})")
        except InputError:
            parts.append(f"{line.name} (unreadable)")
    return ", ".join(parts) or "none"


def line_for(project: Path, version: str | None) -> Line:
    """The line whose pin is vLLM `version` (local labels such as ``+vp.x`` aside); none
    matching is a PinMismatch naming the lines there are."""
    lines = lines_of(project)
    if version is not None:
        for line in lines:
            if line.load().pin.matches_version(version):
                return line
    raise PinMismatch(f"no release line of this project is pinned to vLLM {version or '(unknown version)'}; "
                      f"there are: {describe(project)}; pass --line NAME --force to use one anyway")
