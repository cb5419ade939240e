"""The commands' logic: status, apply, revert and check of a series on a target.

Each computes every resulting file in memory first; only then, under the
target's lock and journal, does anything get written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .engine import Analysis, Contents, analyze, created_modes, touched
from .errors import PatchFailed
from .locking import target_lock
from .patchfile import Patch
from .series import Series
from .targets.base import Found, Target


@dataclass
class Outcome:
    """What a command found and did, for the table, the JSON and the exit code."""

    action: str
    target: str
    analysis: Analysis
    patches: list[Patch]
    found: Found | None = None
    changed: list[str] = field(default_factory=list)
    recovered: str | None = None
    integrity: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dry_run: bool = False
    ok: bool = True

    @property
    def verdict(self) -> str:
        if not self.ok:
            return "failed"
        return self.analysis.verdict


def _identify(target: Target, series: Series, force: bool, notes: list[str]) -> Found:
    if force:
        found = target.found()
        try:
            target.check_pin(series.pin)
        except Exception as exc:  # noqa: BLE001 - reported, then overridden by --force
            notes.append(f"--force: {getattr(exc, 'message', exc)}")
        return found
    return target.check_pin(series.pin)


def _same(a: list[Patch], b: list[Patch]) -> bool:
    return [(p.name, p.sha256) for p in a] == [(p.name, p.sha256) for p in b]


def _fail(outcome: Outcome) -> Outcome:
    outcome.ok = False
    return outcome


def status(target: Target, series: Series, full: bool = False, wait: float = 0.0,
           force: bool = True, on_wait: Callable[[], None] | None = None) -> Outcome:
    """Each patch's state, the pin and the target's bookkeeping; writes only to recover."""
    with target_lock(target.lock_dir, wait, on_wait):
        recovered = target.recover()
    notes: list[str] = []
    found = _identify(target, series, force, notes)
    patches = list(series.patches)
    paths = touched(patches)
    analysis = analyze(patches, target.read(paths))
    recorded = target.recorded_patches()
    if recorded is not None and not _same(recorded, patches):
        old = analyze(recorded, target.read(touched(recorded)))
        names = ", ".join(p.name for p in recorded) or "none"
        notes.append(f"the target carries patches from another version of the series ({names}); "
                     "'apply' replaces them, 'revert' removes them")
        if not analysis.consistent and old.consistent:
            analysis, patches = old, recorded
    outcome = Outcome("status", target.describe(), analysis, patches, found, recovered=recovered,
                      notes=notes, integrity=target.integrity(paths, full))
    outcome.ok = analysis.consistent and not outcome.integrity
    return outcome


def _plan_forward(target: Target, series: Series, notes: list[str]) -> tuple[Analysis, Contents, list[str], Contents]:
    patches = list(series.patches)
    recorded = target.recorded_patches()
    if recorded is not None and not _same(recorded, patches):
        paths = touched([*recorded, *patches])
        contents = target.read(paths)
        old = analyze(recorded, contents)
        if not old.consistent or old.applied != len(recorded):
            return old, {}, paths, contents
        base = {**contents, **old.base}
        analysis = analyze(patches, base)
        if analysis.consistent and analysis.applied:
            analysis.consistent = False
        notes.append("replacing the patches an earlier apply recorded: "
                     + (", ".join(p.name for p in recorded) or "none"))
        return analysis, {**base, **analysis.patched}, paths, contents
    paths = touched(patches)
    contents = target.read(paths)
    analysis = analyze(patches, contents)
    return analysis, {**contents, **analysis.patched}, paths, contents


@contextmanager
def _session(target: Target, series: Series, force: bool, wait: float,
             on_wait: Callable[[], None] | None) -> Iterator[tuple[str | None, Found, list[str]]]:
    """A writing command's start: take the lock, recover an interrupted run, check the pin."""
    with target_lock(target.lock_dir, wait, on_wait):
        recovered = target.recover()
        notes: list[str] = []
        yield recovered, _identify(target, series, force, notes), notes


def _write(action: str, target: Target, patches: list[Patch], analysis: Analysis, paths: list[str],
           contents: Contents, new: Contents, keep: int, dry_run: bool, commit_each: bool,
           recovered: str | None, found: Found, notes: list[str]) -> Outcome:
    """Check, plan and (unless a dry run) carry out a write that leaves `keep` patches applied."""
    outcome = Outcome(action, target.describe(), analysis, patches, found,
                      recovered=recovered, notes=notes, dry_run=dry_run)
    target.verify_before_write(paths, contents, analysis)
    if not analysis.consistent:
        raise PatchFailedWith(_fail(outcome))
    plan = target.plan(analysis, new, patches, keep, commit_each)
    plan.modes.update(created_modes(patches if keep else [p.inverted() for p in patches]))
    outcome.changed = sorted(plan.changes)
    if not dry_run:
        target.commit(plan)
    return outcome


def apply(target: Target, series: Series, dry_run: bool = False, force: bool = False,
          commit_each: bool = False, wait: float = 0.0,
          on_wait: Callable[[], None] | None = None) -> Outcome:
    """Apply every patch not yet applied, all or nothing."""
    with _session(target, series, force, wait, on_wait) as (recovered, found, notes):
        analysis, new, paths, contents = _plan_forward(target, series, notes)
        patches = list(series.patches)
        return _write("apply", target, patches, analysis, paths, contents, new, len(patches), dry_run,
                      commit_each, recovered, found, notes)


def revert(target: Target, series: Series, dry_run: bool = False, force: bool = False,
           commit_each: bool = False, wait: float = 0.0,
           on_wait: Callable[[], None] | None = None) -> Outcome:
    """Undo every applied patch, restoring the original bytes."""
    with _session(target, series, force, wait, on_wait) as (recovered, found, notes):
        recorded = target.recorded_patches()
        patches = recorded if recorded is not None else list(series.patches)
        if recorded is not None and not _same(recorded, list(series.patches)):
            notes.append("reverting the patches an earlier apply recorded, not the current series")
        paths = touched(patches)
        contents = target.read(paths)
        analysis = analyze(patches, contents)
        return _write("revert", target, patches, analysis, paths, contents, {**contents, **analysis.base}, 0,
                      dry_run, commit_each, recovered, found, notes)


def check(base: Target, series: Series, force: bool = False) -> Outcome:
    """The series on the pristine base: every anchor unique, every patch applies, and
    every result unique once applied (so status and revert will recognise it)."""
    notes: list[str] = []
    found = _identify(base, series, force, notes)
    patches = list(series.patches)
    contents = base.read(touched(patches))
    analysis = analyze(patches, contents)
    outcome = Outcome("check", base.describe(), analysis, patches, found, notes=notes)
    if not analysis.consistent or analysis.applied:
        if analysis.consistent:
            outcome.notes.append("the base tree already carries patches; check needs the pristine release")
        return _fail(outcome)
    back = analyze(patches, {**contents, **analysis.patched})
    if not back.consistent or back.applied != len(patches):
        outcome.notes.append("the series applies, but once applied it is not recognised as applied "
                             "(a post-image is not unique): status and revert would fail")
        return _fail(outcome)
    return outcome


def outlook(series: Series, releases: list[str] | None = None, to: str | None = None, repo: str | None = None,
            quiet: bool = False, progress: Callable[[int, int, str], None] | None = None, root: Path | None = None):
    """Each patch's fate on the pinned release and newer ones (see `outlook.build_outlook`);
    reads the upstream cache and the index, writes nothing of the series. `root` (the
    series' project) runs the ``Obsolete-If: test ...`` checks."""
    from .outlook import build_outlook
    from .upstream_trees import UpstreamCache

    return build_outlook(series, UpstreamCache(), releases, to, repo, quiet, progress, root)


class PatchFailedWith(PatchFailed):
    """A patch did not apply: carries the outcome, so the CLI can show every state."""

    def __init__(self, outcome: Outcome) -> None:
        bad = [r for r in outcome.analysis.reports if not r.state.ok]
        first = bad[0] if bad else None
        message = f"{first.name} is {first.state.value}; nothing was changed" if first else \
            "the series does not apply; nothing was changed"
        super().__init__(message)
        self.outcome = outcome
