"""The ``vllm-patch`` console script's entry point, and ``python -m vllm_patch``'s.

Its imports (click, rich, the tool's modules) are most of a short run, and a Ctrl-C among them used to
print a traceback: no handler of the CLI was in place yet. This module imports nothing beyond the
standard library before it installs one, so from its first instruction a Ctrl-C during start-up is one
line and exit 130; once the CLI is loaded, its own handling takes over (a write interrupted later is
rolled back and said so)."""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130
MESSAGE = b"interrupted\n"


def _interrupted_at_start(signum, frame) -> None:
    """Nothing has been read or written yet: say so in one line and leave at once."""
    os.write(2, MESSAGE)
    os._exit(INTERRUPTED)


def run() -> None:
    """Load the CLI under the start-up handler, then run it with the usual KeyboardInterrupt."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:  # a run started with SIGINT ignored (nohup, '&') keeps it so
        signal.signal(signal.SIGINT, _interrupted_at_start)
    from .cli import main

    try:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        main(prog_name="vllm-patch")
    except KeyboardInterrupt:  # between the handler's swap and the CLI's own handling
        os.write(2, MESSAGE)
        sys.exit(INTERRUPTED)
