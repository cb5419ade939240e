"""Three-way merge of one file with ``git merge-file``."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def merge_file(ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str]) -> tuple[bytes, int]:
    """Merge `theirs` (base -> patched) into `ours` (the new upstream file); return the
    result and the number of conflicts (0: clean)."""
    with tempfile.TemporaryDirectory(prefix="vllm-patch-merge-") as tmp:
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            path = Path(tmp) / name
            path.write_bytes(data)
            paths.append(str(path))
        proc = subprocess.run(["git", "merge-file", "-p", "-L", labels[0], "-L", labels[1], "-L", labels[2],
                               *paths], capture_output=True)
    if proc.returncode < 0 or proc.returncode > 127:
        raise RuntimeError(f"git merge-file failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout, proc.returncode


def has_markers(data: bytes) -> bool:
    """True while a file still holds conflict markers at the start of a line."""
    for line in data.decode("utf-8", "replace").split("\n"):
        line = line.rstrip("\r")
        if line == "=======" or line.startswith(("<<<<<<< ", ">>>>>>> ", "||||||| ")):
            return True
    return False
