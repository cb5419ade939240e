"""Three-way merge of one file with ``git merge-file``."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from ..errors import UpstreamError


def merge_file(ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str]) -> tuple[bytes, int]:
    """Merge `theirs` (base -> patched) into `ours` (the new upstream file); return the
    result and the number of conflicts (0: clean)."""
    try:
        with tempfile.TemporaryDirectory(prefix="vllm-patch-merge-") as tmp:
            paths = []
            for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
                path = Path(tmp) / name
                path.write_bytes(data)
                paths.append(str(path))
            proc = subprocess.run(["git", "merge-file", "-p", "-L", labels[0], "-L", labels[1], "-L", labels[2],
                                   *paths], capture_output=True)
    except OSError as exc:
        raise UpstreamError(f"cannot run git merge-file: {exc}") from None
    if proc.returncode < 0 or proc.returncode > 127:
        detail = " ".join(proc.stderr.decode(errors="replace").split())[:300]
        raise UpstreamError(f"git merge-file failed (exit {proc.returncode}): {detail or 'no message'}")
    return proc.stdout, proc.returncode


def _is_marker(line: str) -> bool:
    line = line.rstrip("\r")
    return line == "=======" or line.startswith(("<<<<<<< ", ">>>>>>> ", "||||||| "))


def marker_lines(data: bytes) -> list[int]:
    """The 1-based lines holding a conflict marker at their start."""
    return [i for i, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1) if _is_marker(line)]


def has_markers(data: bytes) -> bool:
    """True while a file still holds conflict markers at the start of a line."""
    return any(_is_marker(line) for line in data.decode("utf-8", "replace").split("\n"))


def conflict_regions(data: bytes | None) -> int:
    """How many conflict regions (``<<<<<<<`` lines) a merged file holds."""
    if data is None:
        return 0
    return sum(1 for line in data.decode("utf-8", "replace").split("\n") if line.startswith("<<<<<<< "))
