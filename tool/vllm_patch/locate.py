"""Where the series comes from, in one order: ``--series`` (or $VLLM_PATCH_SERIES), the working
directory and its parents, this package's own checkout (an editable install), then the lines
bundled inside the installed package (``vllm_patch/_lines``, made at build time by setup.py
and read with importlib.resources). Commands say which one they used."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
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
    if given or os.environ.get(ENV):
        return SeriesHome(Path(given or os.environ[ENV]))
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if _holds_series(d):
            return SeriesHome(d)
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
    return _extracted(data)  # a zipped install: copy out once, per version


def _extracted(data: Traversable) -> Path:
    from .infrastructure.downloads import cache_root

    dest = cache_root() / "bundled" / __version__
    if (dest / SERIES_FILE).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bundled-", dir=dest.parent))

    def copy(node: Traversable, to: Path) -> None:
        for child in node.iterdir():
            if child.is_dir():
                (to / child.name).mkdir()
                copy(child, to / child.name)
            else:
                (to / child.name).write_bytes(child.read_bytes())

    copy(data, tmp)
    try:
        os.replace(tmp, dest)
    except OSError:  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
