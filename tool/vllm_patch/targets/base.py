"""What every target offers: read files, check the pin, and plan and commit writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..engine.analysis import Analysis, Contents
from ..engine.patchfile import Patch
from ..engine.pin import Pin
from ..engine.versionfile import VersionInfo, parse_version_file
from ..errors import InputError, PinMismatch, TargetError
from ..infrastructure.transaction import Journal, commit, read_files, recover
from .identify import not_vllm

VERSION_FILE = "vllm/_version.py"


@dataclass(frozen=True)
class Goal:
    """What a write must leave: the files as `new` has them and the first `keep` of `patches`
    applied. `analysis` is where the target stands before it."""

    analysis: Analysis
    new: Contents
    patches: list[Patch]
    keep: int


@dataclass
class Plan:
    """Everything one command will write, computed before any write. `extra` is journaled with
    the files (what `finish` and `undo` need); `commits`, a checkout's, are built from their goal
    when the plan is carried out, so a dry run writes no git object."""

    changes: Contents
    modes: dict[str, int] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    commits: Goal | None = None


@dataclass
class Found:
    """What the target says it is."""

    version: str | None
    commit: str | None
    source: str


class Target:
    """A place the series goes. Subclasses set `kind` and override the hooks."""

    kind = "tree"

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> str:
        return f"{self.kind} {self.root}"

    @property
    def lock_dir(self) -> Path:
        return self.root

    @property
    def journal(self) -> Journal:
        return Journal.of(self.root)

    def read(self, paths: list[str]) -> Contents:
        return read_files(self.root, paths)

    def found(self) -> Found:
        """Version and commit as read from the tree's ``vllm/_version.py``."""
        info = self._version_file()
        return Found(info.version, info.commit, VERSION_FILE)

    def _version_file(self) -> VersionInfo:
        path = self.root / VERSION_FILE
        if not path.is_file():
            return VersionInfo(None, None)
        return parse_version_file(path.read_text(encoding="utf-8", errors="replace"))

    def check_holds_vllm(self) -> None:
        """Refuse a directory that holds no vLLM at all, saying what it is and what a target is: no line
        and no --force makes it one."""
        problem = not_vllm(self.root)
        if problem:
            raise TargetError(problem)

    def unknown_version(self) -> str:
        """Why the target's vLLM version cannot be told (when `found` has none), for messages."""
        if (self.root / VERSION_FILE).is_file():
            return f"its {VERSION_FILE} names no version"
        return f"no {VERSION_FILE}, which a release's sdist, wheel and install carry"

    def check_pin(self, pin: Pin) -> Found:
        """Raise PinMismatch unless the target is the pinned release, or one the pin declares
        (``also``)."""
        found = self.found()
        if found.version is None:
            raise PinMismatch(f"cannot tell which vLLM {self.root} holds ({self.unknown_version()}); "
                              f"expected {pin.version}; pass --force to go on anyway")
        problems = []
        if not pin.covers(found.version):
            problems.append(f"version {found.version}")
        # The pin's commit is its own release's: a declared later release (``also``) has another.
        declared = pin.covers(found.version) and not pin.matches_version(found.version)
        if found.commit is not None and not declared and not pin.matches_commit(found.commit):
            problems.append(f"commit {found.commit}")
        if problems:
            raise PinMismatch(
                f"{self.root} holds vLLM {' and '.join(problems)} ({found.source}), but the series "
                f"is pinned to {pin.version} at {pin.commit[:9]}{_also(pin)}; rebase the series onto it, "
                "or pass --force")
        return found

    def recorded_patches(self) -> list[Patch] | None:
        """Patches the target records as applied, when it keeps such a record."""
        return None

    def plan(self, goal: Goal) -> Plan:
        """The writes that reach `goal`."""
        current = self.read(list(goal.new))
        return Plan({p: d for p, d in goal.new.items() if current.get(p) != d})

    def plan_commits(self, plan: Plan, goal: Goal) -> None:
        """Make `plan` record each patch as a commit (``--commit``): only a git checkout can."""
        raise InputError(f"--commit: {self.describe()} is not a git checkout; only a checkout records each "
                         "patch as a commit")

    def verify_before_write(self, paths: list[str], contents: Contents, analysis: Analysis) -> None:
        """Refuse to touch files something else has changed (site-packages checks RECORD)."""

    def integrity(self, paths: list[str], full: bool) -> list[str]:
        """Problems found in the target's own bookkeeping (RECORD); empty when sound."""
        return []

    def finish(self, extra: dict) -> None:
        """Last step under the journal (git: move HEAD)."""

    def undo(self, extra: dict) -> None:
        """Undo `finish` when rolling back."""

    def commit(self, plan: Plan) -> None:
        commit(self.journal, plan.changes, plan.modes, plan.extra,
               finish=self.finish if plan.extra else None, undo=self.undo if plan.extra else None)

    def recover(self) -> str | None:
        return recover(self.journal, finish=self.finish, undo=self.undo)


def _also(pin: Pin) -> str:
    return f" (also proven on {', '.join(pin.also)})" if pin.also else ""
