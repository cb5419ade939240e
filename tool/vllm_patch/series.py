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
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .engine.analysis import touched
from .engine.patchfile import Patch, check_path, parse_patch
from .engine.pin import PIN_FIELDS, Pin, pin_from_fields
from .errors import InputError
from .infrastructure import readfile
from .infrastructure.readfile import read_regular

SERIES_FILE = "series"
PATCH_DIR = "patches"


@dataclass(frozen=True)
class Series:
    """Ordered patches plus the pin they apply to."""

    pin: Pin
    patches: tuple[Patch, ...]

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
    fields: dict[str, str] = {}
    names: list[str] = []
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
        name = line.split()[0]
        if len(line.split()) > 1:
            raise InputError(f"{where} line {no}: patch options are not supported: {raw!r}")
        check_path(f"{where} line {no}", name)
        if name in names:
            raise InputError(f"{where} line {no}: {name} is listed twice")
        names.append(name)
    return fields, names


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
    fields, names = parse_series_text(text, str(series_path))
    pin = pin_from_fields(fields, str(series_path))
    patches = []
    for name in names:
        path = root / PATCH_DIR / name
        try:
            data = read_regular(path, readfile.PATCH_LIMIT)
        except FileNotFoundError:
            raise InputError(f"series names {name}, but {path} does not exist") from None
        try:
            patches.append(parse_patch(name, data))
        except InputError as exc:  # name the file, not only the patch: lines share patch names
            raise InputError(f"{path}: {exc.message.removeprefix(f'{name}: ')}") from None
    return Series(pin, tuple(patches))
