"""Runs the probe (``doctor/probe``) in the target interpreter and collects its events.

The probe package is loaded there by its path under a private name, so neither ``vllm_patch`` nor its
dependencies need to be installed in that interpreter, and a ``vllm_patch`` installed there (another
version) is never the one that runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable

from ..errors import TargetError
from .probe import command

TIMEOUT = 900.0


def run_probe(python: str, request: dict, on_event: Callable[[dict], None] = lambda event: None,
              interpret: bool = False, timeout: float = TIMEOUT) -> list[dict]:
    """The probe's events. A probe that cannot start is a TargetError; one that dies midway leaves the
    events it gave, and an ``error`` event saying how it ended (with the last line it printed)."""
    env = dict(os.environ)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    try:
        proc = subprocess.Popen(command(python),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                text=True)
    except OSError as exc:
        raise TargetError(f"cannot run {python}: {exc.strerror or exc}") from None
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
    reader.start()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    events: list[dict] = []
    try:
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events.append(event)
            on_event(event)
        proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        raise
    finally:
        timer.cancel()
        reader.join(5)
    if not events or events[-1].get("event") != "done":
        how = f"was stopped after {timeout:.0f} s" if proc.returncode == -9 else \
            f"exited with status {proc.returncode}"
        last = next((line.strip() for line in reversed(errors) if line.strip()), "")
        events.append({"event": "error", "stage": "probe", "message": f"the probe {how}"
                       + (f": {last}" if last else "")})
    return events
