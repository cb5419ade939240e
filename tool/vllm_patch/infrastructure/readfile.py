"""Reading the project's own input files (series, patches) safely: only regular files, and
never more than a bound far above any real one, so a ``series`` that is a symlink to
``/dev/zero`` or a FIFO is refused in one line instead of read until memory runs out."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import InputError

KIB = 1 << 10
MIB = 1 << 20
# The largest real patch is ~100 KiB and the largest series ~2 KiB.
PATCH_LIMIT = 16 * MIB
SERIES_LIMIT = 1 * MIB


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file (symlinks followed) of at most `limit` bytes.
    FileNotFoundError is the caller's to word; anything else odd is an InputError."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise  # the caller says which file it expected, and why
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"{path} is not a regular file; refusing to read it")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InputError(f"{path} is larger than {_size(limit)}; refusing it (no real one comes near)")
    return data
