"""A per-target lock, so two runs never interleave their writes.

The lock is an ``flock`` on the target's root directory itself: it leaves no
file behind and dies with the process that held it, even on SIGKILL.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import LockBusy, TargetError


@contextmanager
def target_lock(directory: Path, wait: float = 0.0, on_wait=None) -> Iterator[None]:
    """Hold an exclusive lock on `directory`, waiting up to `wait` seconds."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise TargetError(f"cannot open {directory} to lock it: {exc.strerror}") from None
    try:
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockBusy(f"another vllm-patch run is working on {directory}; "
                                   "retry when it ends, or pass --wait SECONDS") from None
                if on_wait and not told:
                    on_wait()
                    told = True
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
