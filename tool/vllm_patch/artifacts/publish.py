"""Put a built file into a shared output directory (``dist/``) so that no half-written file ever
carries its final name, and what a killed run left behind goes at the next run.

The file is written as ``.<final>.partial-<pid>`` (hidden, and not ending in ``.whl``: no tool
takes it for a wheel), flushed to disk, then renamed into place. The whole write holds the
directory's lock (an flock, released by the kernel even on SIGKILL), so every partial found while
holding it belongs to a run that is gone, and is removed; so are the ``.build-*`` folders in which
earlier versions built.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ..errors import TargetError
from ..infrastructure.locking import target_lock

PARTIAL = re.compile(r"^\..+\.partial-\d+$")
LEGACY_PREFIX = ".build-"  # where versions up to issue 29 built, leaving a cut-off wheel when killed


def partial_name(final: str) -> str:
    """The name this process writes `final` under until it is complete."""
    return f".{final}.partial-{os.getpid()}"


def stale(directory: Path) -> list[Path]:
    """The leftovers of interrupted runs in `directory` (call it only while holding its lock)."""
    found = []
    for path in sorted(directory.iterdir()):
        if path.is_symlink():
            continue
        if (path.is_file() and PARTIAL.match(path.name)) or (path.is_dir() and path.name.startswith(LEGACY_PREFIX)):
            found.append(path)
    return found


def sweep(directory: Path) -> list[str]:
    """Remove the leftovers of interrupted runs; their names."""
    removed = []
    for path in stale(directory):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def publish(directory: Path, final: str, write: Callable[[Path], None], wait: float = 30.0,
            on_wait: Callable[[], None] | None = None) -> list[str]:
    """Write `directory/final` with `write(partial_path)`, renaming it into place once written,
    under the directory's lock; the names of the interrupted runs' leftovers it removed first."""
    directory.mkdir(parents=True, exist_ok=True)
    with target_lock(directory, wait, on_wait):
        removed = sweep(directory)
        partial = directory / partial_name(final)
        try:
            write(partial)
            with open(partial, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(partial, directory / final)
        except OSError as exc:  # a full disk: the write that fails names no file
            raise TargetError(f"cannot write {directory / final}: {exc.strerror or exc}; "
                              "nothing was changed") from None
        finally:
            partial.unlink(missing_ok=True)
    return removed
