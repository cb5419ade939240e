"""A line written out as a plain series: its ``series`` file (the pin, then one patch name a line) and every patch's
bytes under ``patches/``, with the patches it carries from another line copied in, so quilt and ``git am`` read it
as it is. Written into a temporary folder beside the destination and renamed into place: all or nothing."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..errors import InputError
from ..series import PATCH_DIR, SERIES_FILE, Series, render_series


def export_series(series: Series, dest: Path, line: str) -> list[str]:
    """Write `series` (line `line`'s) to `dest`, a new or empty folder; returns the patch names written."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError(f"{dest} exists and is not an empty folder: nothing was written")
    if not dest.parent.is_dir():
        raise InputError(f"no folder {dest.parent} to export into: nothing was written")
    head = [f"# Line {line} of vllm-patch for vLLM {series.pin.version}, exported: the patches in order, for quilt "
            "or git am."]
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        (tmp / PATCH_DIR).mkdir()
        for patch in series.patches:
            (tmp / PATCH_DIR / patch.name).write_bytes(patch.raw)
        (tmp / SERIES_FILE).write_text(render_series(head, series.pin, series.names), encoding="utf-8")
        if dest.exists():
            dest.rmdir()
        tmp.rename(dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"cannot write {dest}: {exc.strerror or exc}: nothing was written") from None
    return list(series.names)
