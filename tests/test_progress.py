"""Progress lines and bars for long transfers."""

from __future__ import annotations

import io

from vllm_patch.infrastructure import progress
from vllm_patch.infrastructure.progress import transfer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_unknown_total_gets_a_line_per_step(monkeypatch):
    monkeypatch.setattr(progress, "UNSIZED_STEP", 100)
    stream = io.StringIO()
    with transfer("copying x", None, stream=stream) as advance:
        for _ in range(5):
            advance(50)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and all(line.startswith("copying x: ") for line in lines)


def test_a_terminal_gets_a_bar_not_lines():
    stream = Terminal()
    with transfer("copying x", 1000, stream=stream) as advance:
        advance(1000)
    assert "copying x: 100%" not in stream.getvalue()


def test_quiet_says_nothing():
    stream = io.StringIO()
    with transfer("copying x", 10, quiet=True, stream=stream) as advance:
        advance(10)
    assert stream.getvalue() == ""


def test_a_small_transfer_passes_in_silence():
    """A few kilobytes (an index page, a small sdist) give no lines: they would only stand beside an error."""
    stream = io.StringIO()
    with transfer("copying x", progress.QUIET_BELOW - 1, stream=stream) as advance:
        advance(progress.QUIET_BELOW - 1)
    assert stream.getvalue() == ""
    with transfer("copying y", progress.QUIET_BELOW, stream=stream) as advance:
        advance(progress.QUIET_BELOW)
    assert stream.getvalue().splitlines()[-1].startswith("copying y: 100%")
