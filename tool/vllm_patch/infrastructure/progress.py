"""Progress of a long transfer: a bar on a terminal; elsewhere (CI logs, pipes) one line on
stderr every tenth of the way, so a 336 MB download is never silent and never floods a log."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

MB = 1_000_000
# Without a known total, a line every this many bytes.
UNSIZED_STEP = 50 * MB
# Smaller transfers of a known size pass in silence: a line per tenth of a few kilobytes is noise
# (and would stand beside the one line of an error that follows a failed download).
QUIET_BELOW = 10 * MB


class LineProgress:
    """One line each time the transfer passes another 10% (or UNSIZED_STEP bytes)."""

    def __init__(self, what: str, total: int | None, stream: TextIO) -> None:
        self.what, self.total, self.stream = what, total, stream
        self.done = 0
        self.said = 0  # tenths (or UNSIZED_STEPs) already reported

    def advance(self, n: int) -> None:
        self.done += n
        if self.total is not None and self.total < QUIET_BELOW:
            return
        step = self.done * 10 // self.total if self.total else self.done // UNSIZED_STEP
        if step > self.said:
            self.said = step
            if self.total:
                self._say(f"{min(step * 10, 100)}% ({self.done / MB:.1f} of {self.total / MB:.1f} MB)")
            else:
                self._say(f"{self.done / MB:.1f} MB so far")

    def _say(self, text: str) -> None:
        print(f"{self.what}: {text}", file=self.stream, flush=True)


@contextmanager
def transfer(what: str, total: int | None, quiet: bool = False,
             stream: TextIO | None = None) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n)` for a transfer of `total` bytes (None: unknown), shown on `stream`
    (default stderr): nothing when `quiet`, a bar on a terminal, else LineProgress."""
    stream = stream or sys.stderr
    if quiet:
        yield lambda n: None
    elif stream.isatty():
        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      console=Console(file=stream), transient=True) as progress:
            task = progress.add_task(what, total=total)
            yield lambda n: progress.advance(task, n)
    else:
        yield LineProgress(what, total, stream).advance
