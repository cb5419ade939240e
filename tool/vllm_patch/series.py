"""The series: the ordered patch names and the pin, read from the ``series`` file.

Format (quilt-compatible: quilt sees the pin as comments)::

    # free comments
    #: version = 0.20.0
    #: tag = v0.20.0
    #: commit = b8160878f07fe6aff02deb12bc842df3fa4a9237
    #: sdist = vllm-0.20.0.tar.gz sha256:HEX
    #: wheel = vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl sha256:HEX
    #: also = 0.20.1 0.20.2
    0001-first-fix.patch
    0002-carried-fix.patch from current
    0003-other-fix.patch from current/0002-other-fix.patch

A patch listed ``from LINE`` (``current``, or a folder of ``lines/``) is that line's own patch file of the same
name (or the name after the slash), read from there: a line that carries another line's fix refers to it instead
of holding a copy that could drift. ``vllm-patch export`` writes any line out as a plain series for quilt or
``git am``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .engine.analysis import touched
from .engine.patchfile import Patch, check_path, parse_patch
from .engine.pin import PIN_FIELDS, Pin, pin_from_fields, pin_lines
from .errors import InputError
from .infrastructure import readfile
from .infrastructure.readfile import read_regular

SERIES_FILE = "series"
PATCH_DIR = "patches"
LINES_DIR = "lines"
CURRENT = "current"  # the line of the top-level series


@dataclass(frozen=True)
class Series:
    """Ordered patches plus the pin they apply to; `sources` names the patches carried by reference, each with the
    ``LINE/NAME`` it is read from."""

    pin: Pin
    patches: tuple[Patch, ...]
    sources: tuple[tuple[str, str], ...] = ()

    def source_of(self, name: str) -> str | None:
        """``LINE/NAME`` of a patch carried from another line, or None for the line's own."""
        return dict(self.sources).get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.patches)

    def touched_paths(self) -> tuple[str, ...]:
        """Every path any patch touches, in first-seen order."""
        return tuple(touched(self.patches))

    @property
    def digest(self) -> str:
        """A short hash of the pin and every patch's bytes: names a patched build."""
        h = hashlib.sha256(f"{self.pin.version}\0{self.pin.commit}\0".encode())
        for p in self.patches:
            h.update(p.name.encode() + b"\0" + p.raw + b"\0")
        return h.hexdigest()[:12]


def parse_series_text(text: str, where: str = "series") -> tuple[dict[str, str], list[str]]:
    """Split a series file into pin fields and patch names (pure; `where` names the file in
    messages)."""
    fields, names, _ = parse_series_entries(text, where)
    return fields, names


def parse_series_entries(text: str, where: str = "series") -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Pin fields, patch names, and for each patch carried from another line its ``LINE/NAME`` (pure)."""
    fields: dict[str, str] = {}
    names: list[str] = []
    sources: dict[str, str] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#:"):
            key, sep, value = line[2:].partition("=")
            key = key.strip()
            if not sep or key not in PIN_FIELDS:
                raise InputError(f"{where} line {no}: expected '#: KEY = VALUE' with KEY one of "
                                 f"{', '.join(PIN_FIELDS)}, got {raw!r}")
            if key in fields:
                raise InputError(f"{where} line {no}: pin '{key}' given twice")
            fields[key] = value.strip()
            continue
        if not line or line.startswith("#"):
            continue
        words = line.split()
        name = words[0]
        if len(words) == 3 and words[1] == "from":
            sources[name] = _source(f"{where} line {no}", name, words[2])
        elif len(words) > 1:
            raise InputError(f"{where} line {no}: expected a patch name, or 'NAME from LINE[/NAME]'; patch options "
                             f"are not supported: {raw!r}")
        check_path(f"{where} line {no}", name)
        if name in names:
            raise InputError(f"{where} line {no}: {name} is listed twice")
        names.append(name)
    return fields, names, sources


def render_series(head: list[str], pin: Pin, names: list[str] | tuple[str, ...],
                  sources: dict[str, str] | None = None) -> str:
    """A series file: comment lines, the pin, then one entry a patch (``NAME from LINE/NAME`` where carried)."""
    sources = sources or {}
    entries = [f"{n} from {sources[n].removesuffix(f'/{n}')}" if n in sources else n for n in names]
    return "\n".join([*head, *pin_lines(pin), *entries]) + "\n"


def _source(where: str, name: str, spec: str) -> str:
    """``LINE/NAME`` of a ``from`` entry, its patch name defaulting to the entry's own."""
    line, _, source = spec.partition("/")
    check_path(where, line)
    check_path(where, source or name)
    if "/" in (source or name):
        raise InputError(f"{where}: {spec!r} names a path; expected LINE or LINE/NAME")
    return f"{line}/{source or name}"


def line_root(project: Path, line: str) -> Path:
    """The folder holding line `line`'s series: the project itself for ``current``, else ``lines/LINE``."""
    return project if line == CURRENT else project / LINES_DIR / line


def project_of(series_root: Path) -> Path:
    """The project holding a series directory: a line's ``lines/NAME`` lies two levels down."""
    return series_root.parent.parent if series_root.parent.name == LINES_DIR else series_root


def load_series(root: Path) -> Series:
    """Read ``root/series`` and every patch it names from ``root/patches`` (regular files of
    bounded size only)."""
    series_path = root / SERIES_FILE
    try:
        text = read_regular(series_path, readfile.SERIES_LIMIT).decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"no series file at {series_path}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {series_path}: {exc}") from None
    fields, names, sources = parse_series_entries(text, str(series_path))
    pin = pin_from_fields(fields, str(series_path))
    patches = []
    others: dict[str, tuple[list[str], dict[str, str]]] = {}  # each line carried from, its series read once
    for name in names:
        path = _carried_path(root, sources[name], series_path, others) if name in sources else root / PATCH_DIR / name
        try:
            data = read_regular(path, readfile.PATCH_LIMIT)
        except FileNotFoundError:
            raise InputError(f"series names {name}, but {path} does not exist") from None
        try:
            patches.append(parse_patch(name, data))
        except InputError as exc:  # name the file, not only the patch: lines share patch names
            raise InputError(f"{path}: {exc.message.removeprefix(f'{name}: ')}") from None
    return Series(pin, tuple(patches), tuple(sources.items()))


def _carried_path(root: Path, source: str, series_path: Path,
                  others: dict[str, tuple[list[str], dict[str, str]]]) -> Path:
    """The file a ``from`` entry reads: a patch the other line lists as its own (a reference to a reference, or to
    a patch that line no longer lists, is refused). `others` keeps each other line's entries once read."""
    line, name = source.split("/")
    other = line_root(project_of(root), line)
    if line not in others:
        try:
            text = read_regular(other / SERIES_FILE, readfile.SERIES_LIMIT).decode("utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            raise InputError(f"{series_path} carries {source}, but there is no readable line {line!r} "
                             f"({other / SERIES_FILE})") from None
        _, listed, carried = parse_series_entries(text, str(other / SERIES_FILE))
        others[line] = (listed, carried)
    names, sources = others[line]
    if name not in names:
        raise InputError(f"{series_path} carries {source}, but line {line} does not list {name}")
    if name in sources:
        raise InputError(f"{series_path} carries {source}, which line {line} carries from {sources[name]}: "
                         "refer to the line that holds the file")
    return other / PATCH_DIR / name
