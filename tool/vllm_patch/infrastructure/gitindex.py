"""Commits built in a private git index: the one place for the temporary index file,
blob writes and the file-mode rule that the checkout target, the patch writer and the
upstream cache share. The real index and any work tree are never touched."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import git


def git_mode(mode: int) -> str:
    """git's mode for a regular file: executable or not, nothing else."""
    return "100755" if mode & 0o111 else "100644"


@contextmanager
def private_index(directory: Path | str) -> Iterator[dict[str, str]]:
    """The environment of a fresh, empty index file in `directory` (a git dir), removed after."""
    fd, index = tempfile.mkstemp(prefix="vllm-patch-index-", dir=directory)
    os.close(fd)
    os.unlink(index)  # git wants to create it itself
    try:
        yield {"GIT_INDEX_FILE": index}
    finally:
        Path(index).unlink(missing_ok=True)


def stage(g: git.Git, env: dict[str, str], contents: Mapping[str, bytes | None],
          mode_of: Callable[[str], int]) -> None:
    """Write each file's blob and put it in the index of `env` with mode ``mode_of(path)``;
    None removes the path (a mode-0 entry, which needs no work tree)."""
    lines = []
    for rel, data in contents.items():
        if data is None:
            lines.append(f"0 {'0' * 40}\t{rel}")
            continue
        with tempfile.TemporaryFile() as tmp:
            tmp.write(data)
            tmp.seek(0)
            blob = g.hash_object("-w", "--stdin", istream=tmp)
        lines.append(f"{git_mode(mode_of(rel))} {blob}\t{rel}")
    if lines:
        with tempfile.TemporaryFile() as tmp:
            tmp.write(b"".join(line.encode("utf-8") + b"\0" for line in lines))
            tmp.seek(0)
            g.update_index("-z", "--index-info", istream=tmp, env=env)
