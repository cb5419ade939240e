"""Where the series comes from, in one order: ``--series`` (or $VLLM_PATCH_SERIES), the working
directory and its parents, this package's own checkout (an editable install), then the lines
bundled inside the installed package (``vllm_patch/_lines``, made at build time by setup.py
and read with importlib.resources). Commands say which one they used, and an error reading it says
how it was chosen where the path alone does not (the environment variable, a series found in the
working directory before the bundled lines)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .errors import InputError
from .series import PATCH_DIR, SERIES_FILE, Series

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

BUNDLE = "_lines"  # setup.py writes it under this name
ENV = "VLLM_PATCH_SERIES"


@dataclass(frozen=True)
class SeriesHome:
    """The project directory holding the series (and ``lines/``), and whether it is the bundled copy."""

    root: Path
    bundled: bool = False
    found_in: str = field(default="", compare=False)
    """How it was chosen, for errors about it: ``$VLLM_PATCH_SERIES`` (ENV), "the working directory" or
    "a parent of the working directory"; empty where the path says enough (--series, the checkout, the bundle)."""

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Errors reading this series (or choosing a line of it) say how it was chosen, where the path
        alone does not: a mistyped variable, or a stray series lying where the command runs."""
        try:
            yield
        except InputError as exc:
            if self.found_in == ENV:
                raise InputError(f"{ENV}={self.root}: {exc.message}") from None
            if self.found_in:
                raise InputError(f"{exc.message} (the series in {self.root}, found in {self.found_in}, is used "
                                 "before the lines bundled with vllm-patch; run elsewhere or pass --series DIR)") \
                    from None
            raise

    def check_writable(self) -> None:
        """Refuse the bundled copy to the commands that edit a series (rebase, refresh, new, import):
        it lives inside the installed package, and the next install would silently undo the edit."""
        if self.bundled:
            raise InputError(f"the series bundled with vllm-patch {__version__} is read-only; edit a checkout "
                             "of it (run there, or pass --series DIR)")

    def describe(self, series_root: Path, series: Series) -> str:
        """Where `series` (read from `series_root`, this home or a line of it) came from, for output."""
        where = f"bundled with vllm-patch {__version__}" if self.bundled else f"from {series_root}"
        return f"series {series.digest} {where}"


def _holds_series(d: Path) -> bool:
    return (d / SERIES_FILE).is_file() and (d / PATCH_DIR).is_dir()


def find_home(given: Path | None = None, start: Path | None = None) -> SeriesHome:
    """The series' home in the documented order (`given`: --series; else $VLLM_PATCH_SERIES)."""
    if given:
        return SeriesHome(Path(given))
    if os.environ.get(ENV):
        return SeriesHome(Path(os.environ[ENV]), found_in=ENV)
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if _holds_series(d):
            return SeriesHome(d, found_in="the working directory" if d == here else "a parent of the working directory")
    checkout = Path(__file__).resolve().parents[2]
    if _holds_series(checkout):
        return SeriesHome(checkout)
    bundled = bundled_root()
    if bundled is not None:
        return SeriesHome(bundled, bundled=True)
    raise InputError("no series found: run inside the vllm-patch repository, pass --series DIR, "
                     "or install vllm-patch from a wheel (which bundles the release lines)")


def bundled_root() -> Path | None:
    """The bundled lines as a directory, or None where the package has none (a checkout)."""
    data = resources.files(__package__) / BUNDLE
    if not data.is_dir():
        return None
    if isinstance(data, Path):
        return data
    return _extracted(data)  # a zipped install: copy out once, per bundle


def _files(node: Traversable, prefix: str = "") -> Iterator[tuple[str, Traversable]]:
    """Every file under `node`, with its path relative to it, in name order."""
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.is_dir():
            yield from _files(child, f"{prefix}{child.name}/")
        else:
            yield f"{prefix}{child.name}", child


def bundle_digest(files: list[tuple[str, bytes]]) -> str:
    """What a bundle holds (every file's path and bytes), hashed: two builds of one version that carry
    other series differ here, so neither reuses the other's extracted copy."""
    h = hashlib.sha256()
    for rel, content in files:
        h.update(f"{rel}\0{len(content)}\0".encode() + content)
    return h.hexdigest()[:16]


def _extracted(data: Traversable) -> Path:
    """The zipped bundle as a directory of the cache, one per bundle (version and digest)."""
    from .infrastructure.downloads import cache_root

    files = [(rel, node.read_bytes()) for rel, node in _files(data)]
    dest = cache_root() / "bundled" / f"{__version__}-{bundle_digest(files)}"
    if (dest / SERIES_FILE).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bundled-", dir=dest.parent))
    for rel, content in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(content)
    try:
        os.replace(tmp, dest)
    except OSError:  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
