"""The install under examination: the vLLM found (version, commit, where), the release line that covers it
and each patch's state there (``operations.status``), the guard, and the environment variables the line
reads."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from importlib.metadata import PathDistribution
from pathlib import Path

from .. import operations
from ..errors import PinMismatch
from ..locate import SeriesHome
from ..series import Series
from ..targets.base import Target

GUARD_ENV = "VLLM_PATCH_GUARD"
GUARD_DIST = "vllm_patch_guard"
# The guard's modes (vllm_patch_guard.MODES): anything else refuses to start.
GUARD_MODES = {"": "warn", "warn": "warn", "strict": "strict", "off": "off", "0": "off", "false": "off", "no": "off"}
ENV_NAME = re.compile(r"\bVLLM_[A-Z0-9_]+\b")
# Where the line's multi-query kernel lives in a vLLM tree.
KERNEL = "vllm/v1/attention/ops/triton_turboquant_verify.py"


@dataclass
class Install:
    """What `examine` found: plain data for the report and the JSON."""

    version: str | None
    commit: str | None
    where: str
    line: str | None = None
    line_note: str | None = None
    pin: str | None = None
    digest: str | None = None
    verdict: str | None = None
    ok: bool = True
    patches: list[dict] = field(default_factory=list)
    integrity: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    guard: dict = field(default_factory=dict)
    env: dict[str, str | None] = field(default_factory=dict)
    kernel_installed: bool = False
    fix: str | None = None

    @property
    def fully_applied(self) -> bool:
        return self.line is None or (self.ok and self.verdict == "applied")


def env_names(series: Series | None) -> list[str]:
    """The environment variables the line's patches read (names on their added lines), and the guard's."""
    names = set()
    for patch in series.patches if series else ():
        for line in patch.raw.decode("utf-8", "replace").splitlines():
            if line.startswith("+") and not line.startswith("+++"):
                names.update(ENV_NAME.findall(line))
    return [*sorted(names - {GUARD_ENV}), GUARD_ENV]


def guard(root: Path, series: Series | None) -> dict:
    """Whether vllm-patch-guard is installed next to vLLM, its version, whether it knows this line's
    series (a guard built before the series changed does not), and its mode."""
    value = os.environ.get(GUARD_ENV)
    mode = GUARD_MODES.get((value or "").strip().lower(), "invalid: vLLM refuses to start")
    found = sorted(root.glob(f"{GUARD_DIST}-*.dist-info"))
    info: dict = {"installed": bool(found), "version": None, "knows_series": None, "mode": mode,
                  "env": value}
    if not found:
        return info
    info["version"] = PathDistribution(found[-1]).version
    data = root / GUARD_DIST / "lines.json"
    if series is not None and data.is_file():
        try:
            lines = json.loads(data.read_text(encoding="utf-8")).get("lines", [])
            info["knows_series"] = any(entry.get("digest") == series.digest for entry in lines)
        except (OSError, ValueError, AttributeError):
            info["knows_series"] = False
    return info


def line_name(home: SeriesHome, root: Path) -> str:
    """The name of the line whose series lives in `root`."""
    from ..lines import CURRENT, lines_of

    return next((line.name for line in lines_of(home.root) if line.root.resolve() == root.resolve()), CURRENT)


def examine(home: SeriesHome, target: Target, where: str, fix: str, line: str | None = None,
            wait: float = 0.0) -> Install:
    """The install's facts. `where` says where the vLLM is, in the words the user gave; `fix` is the
    command that applies the line."""
    target.check_holds_vllm()
    found = target.found()
    install = Install(found.version, found.commit, where)
    try:
        series, note, root = operations.series_for(home, target, line)
    except PinMismatch as exc:
        install.notes.append(exc.message)
        series = None
    if series is not None:
        outcome = operations.status(target, series, wait=wait, force=True)
        install.line = line_name(home, root)
        install.line_note = note
        install.pin = series.pin.version
        install.digest = series.digest
        install.verdict = outcome.verdict
        install.ok = outcome.ok
        install.patches = [{"name": r.name, "state": r.state.value} for r in outcome.analysis.reports]
        install.integrity = list(outcome.integrity)
        install.notes += outcome.notes
        if not install.fully_applied:
            install.fix = fix
    install.kernel_installed = (target.root / KERNEL).is_file()
    install.guard = guard(target.root, series)
    install.env = {name: os.environ.get(name) for name in env_names(series)}
    return install
