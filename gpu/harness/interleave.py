"""Interleaved repeated runs of several engines, and their spreads.

`Fleet` boots every engine of a comparison at once (each a `harness.serve` process with its share
of the GPU), warms each up, then runs them in turn, rotating the order every round, so that slow
drift (clocks, temperature, the host) reaches every configuration alike. `spread` and
`ratio_of_medians` are the figures a benchmark prints: min / median / max of each configuration's
throughput and the ratio of medians against a baseline measured in the same run.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .runner import _env, _job, engine_digest, reap
from .scenarios import Engine


@dataclass(frozen=True)
class Spread:
    low: float
    median: float
    high: float

    def __str__(self) -> str:
        return f"{self.low:8.1f} {self.median:8.1f} {self.high:8.1f}"


def spread(values: list[float]) -> Spread:
    """min / median / max; a spread of no values is an error (a configuration that never ran)."""
    if not values:
        raise ValueError("no runs")
    return Spread(min(values), statistics.median(values), max(values))


def ratio_of_medians(values: list[float], baseline: list[float]) -> float:
    return statistics.median(values) / statistics.median(baseline)


def rotations(labels: list[str], rounds: int) -> list[list[str]]:
    """The run order of each round: round r starts at the r-th label, so no configuration always
    runs first (or right after the same neighbour)."""
    n = len(labels)
    return [[labels[(r + i) % n] for i in range(n)] for r in range(rounds)]


@dataclass
class Member:
    label: str
    engine: Engine
    proc: subprocess.Popen | None = None
    boot: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> str | None:
        err = self.boot.get("error") or next((r["error"] for r in self.runs if "error" in r), None)
        return None if err is None else f"{err.get('type')}: {err.get('message')} at {err.get('at')}"


def describe_platforms(boots: list[dict[str, Any]]) -> str:
    """Each distinct card-and-stack among engines' ready messages, in words, joined by "; "."""
    seen = dict.fromkeys(f"{b['device']} (torch {b.get('torch', '?')}, Triton {b.get('triton', '?')})"
                         for b in boots if b.get("device"))
    return "; ".join(seen) or "unknown"


class Fleet:
    """Engines booted together and run one at a time (see the module docstring)."""

    def __init__(self, members: list[tuple[str, Engine, Path]], model_dirs: dict[str, Path], work: Path,
                 extra_path: list[Path]) -> None:
        self.members: dict[str, Member] = {}
        self.trees = {label: tree for label, _, tree in members}
        for label, engine, tree in members:
            # One folder per member: two trees may run the same engine.
            out = work / "bench" / f"{engine_digest(engine)}-{hashlib.sha256(label.encode()).hexdigest()[:8]}"
            out.mkdir(parents=True, exist_ok=True)
            job = out / "job.json"
            job.write_text(json.dumps(_job(engine, model_dirs[engine.model.name])))
            log = open(out / "serve.log", "wb")  # noqa: SIM115 - lives as long as the process
            proc = subprocess.Popen([sys.executable, "-m", "harness.serve", str(job)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                                    env=_env(tree, extra_path, work / "cache", engine.env))
            self.members[label] = Member(label, engine, proc)
        for m in self.members.values():
            m.boot = self._read(m) or {"error": {"type": "exit", "message": "no answer", "at": None}}

    @staticmethod
    def _read(m: Member) -> dict[str, Any] | None:
        line = m.proc.stdout.readline() if m.proc and m.proc.stdout else ""
        while line and not line.startswith("{"):
            line = m.proc.stdout.readline()
        return json.loads(line) if line else None

    def platform(self) -> str:
        """The card and stack the booted engines reported (harness.serve.platform), in words: "NVIDIA H200
        (torch 2.14.0+cu130, Triton 3.8.0)"; each distinct one once, "unknown" when no engine booted."""
        return describe_platforms([m.boot for m in self.members.values()])

    def ask(self, label: str, command: dict[str, Any]) -> dict[str, Any]:
        """One command of harness.serve to one engine, and its answer."""
        m = self.members[label]
        if m.failed:
            return {"error": {"type": "skipped", "message": m.failed, "at": None}}
        m.proc.stdin.write(json.dumps(command) + "\n")
        m.proc.stdin.flush()
        return self._read(m) or {"error": {"type": "exit", "message": "the engine process died", "at": None}}

    def run(self, label: str, workload: str, batch: int, min_seconds: float) -> dict[str, Any]:
        return self.ask(label, {"run": workload, "batch": batch, "min_seconds": min_seconds})

    def drafts(self, label: str, workload: str, batch: int) -> dict[str, Any]:
        """One untimed pass of the workload's first ``batch`` prompts, with the speculator's proposals."""
        return self.ask(label, {"drafts": workload, "batch": batch})

    def close(self) -> None:
        for m in self.members.values():
            if m.proc and m.proc.poll() is None:
                try:
                    m.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                    m.proc.stdin.flush()
                    m.proc.wait(timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    m.proc.kill()
            if m.proc:
                reap(m.proc.pid)  # its tensor-parallel workers, if it left them
