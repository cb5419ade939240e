"""The commands' logic: every command of the CLI goes through here.

status, apply, revert and check of a series on a target; build-wheel; outlook,
rebase and the authoring commands (refresh, new, import) on the series
directory. Each computes every resulting file in memory first; only then, under
the target's (or the series directory's) lock and journal, does anything get
written. The CLI parses options and prints what these return (through report).

Imports sit at the top, except the lifecycle room's (outlook, rebase, authoring): it brings GitPython, so
each function that needs it imports it, marked with what it adds to ``import vllm_patch.cli`` (~170 ms),
measured with ``python -X importtime``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

from . import doctor as doctor_room  # the module, not its names: doctor.install imports operations back
from .artifacts.export import export_series
from .artifacts.wheel import build_wheel as build_patched_wheel
from .artifacts.wheel import wheel_release
from .engine.analysis import Analysis, Contents, analyze, created_modes, touched
from .engine.carried import CarriedFile
from .engine.carried import carried_files as find_carried
from .engine.patchfile import Patch
from .errors import InputError, PatchFailed, PinMismatch
from .errors import RebaseConflict as RebaseConflict  # re-exported: `rebase` raises it, the CLI catches it here
from .infrastructure.downloads import fetch, pinned_base_tree
from .infrastructure.locking import target_lock
from .infrastructure.transaction import SeriesDir
from .lines import CURRENT, choose_line, line_named, lines_of
from .locate import SeriesHome
from .series import Series, load_series, project_of
from .targets import open_target
from .targets.base import Found, Goal, Target

if TYPE_CHECKING:
    from .lifecycle.patchwriter import Header


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
    series_from: str | None = None  # where the series came from (a checkout path, or bundled)

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
        except PinMismatch as exc:  # reported, then overridden; any other failure still stops the run
            notes.append(f"--force: {exc.message}")
        return found
    return target.check_pin(series.pin)


def _same(a: list[Patch], b: list[Patch]) -> bool:
    return [(p.name, p.sha256) for p in a] == [(p.name, p.sha256) for p in b]


def _fail(outcome: Outcome) -> Outcome:
    outcome.ok = False
    return outcome


def status(target: Target, series: Series, full: bool = False, wait: float = 0.0,
           force: bool = True, on_wait: Callable[[], None] | None = None, expect: str | None = None) -> Outcome:
    """Each patch's state, the pin and the target's bookkeeping; writes only to recover.
    Everything is read under the target's lock, so a run writing it is never seen half done.
    With `expect` ("applied" or "applies") the outcome fails unless every patch is so."""
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
        if expect and outcome.ok and outcome.verdict != expect:
            outcome.ok = False
            outcome.notes.append(f"expected every patch {expect}, found: {analysis.verdict}")
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
    goal = Goal(analysis, new, patches, keep)
    plan = target.plan(goal)
    if commit_each:
        target.plan_commits(plan, goal)
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
    base.check_holds_vllm()
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


def check_base(series: Series, base: Path | None = None, force: bool = False, quiet: bool = False) -> Outcome:
    """`check` on the pristine tree `base`, or by default on the pinned release's sdist (downloaded once,
    cached): the whole of the ``check`` command, so the CLI never reaches for downloads itself."""
    root = base if base else pinned_base_tree(series.pin, quiet=quiet)
    return check(open_target(str(root), "auto" if base else "tree"), series, force)


def outlook(series: Series, releases: list[str] | None = None, to: str | None = None, repo: str | None = None,
            quiet: bool = False, progress: Callable[[int, int, str], None] | None = None, root: Path | None = None):
    """Each patch's fate on the pinned release and newer ones (see `outlook.build_outlook`);
    reads the upstream cache and the index, writes nothing of the series. `root` (the
    series' project) runs the ``Obsolete-If: test ...`` checks."""
    from .lifecycle.outlook import build_outlook  # lazy: +~60 ms at start (GitPython ~30 ms of it)
    from .lifecycle.upstream_trees import UpstreamCache

    return build_outlook(series, UpstreamCache(), releases, to, repo, quiet, progress, root)


def export(series: Series, dest: Path, line: str) -> list[str]:
    """The line as a plain series in `dest` (see artifacts.export)."""
    return export_series(series, dest, line)


def series_for(home: SeriesHome, target: Target, line: str | None = None,
               force: bool = False) -> tuple[Series, str | None, Path]:
    """The series to use on `target`, a note saying which line it is (`lines.choose_line`: the
    same rule for apply, revert, status and build-wheel), and the line's directory."""
    target.check_holds_vllm()
    version = target.found().version
    with home.reading():
        chosen, note = choose_line(home.root, version, line, force,
                                   unknown="" if version else f"{target.root}: {target.unknown_version()}")
        return chosen.load(), note, chosen.root


def series_for_wheel(home: SeriesHome, source: Path | None,
                     line: str | None = None) -> tuple[Series, str | None, Path]:
    """The series build-wheel uses: for a given wheel, the line proven on the wheel's release, as
    `series_for` chooses for a target (--line wins, and must cover it); without one, --line or the
    current line, whose pinned wheel is then built."""
    release = wheel_release(source) if source is not None else None
    with home.reading():
        if release is None:
            chosen, note = line_named(home.root, line or CURRENT), None
        else:
            chosen, note = choose_line(home.root, release, line, what="the wheel",
                                       hint="build it with a line that covers it, or rebase a line onto it")
        series = chosen.load()
    if release is not None and not series.pin.covers(release):
        raise PinMismatch(f"{source.name} is vLLM {release}, but release line {chosen.name} is proven on vLLM "
                          f"{', '.join(series.pin.releases)}; leave out --line to have the line proven on it chosen")
    return series, note, chosen.root


def build_wheel(series: Series, source: Path | None, out_dir: Path, quiet: bool = False, wait: float = 30.0,
                on_wait: Callable[[], None] | None = None):
    """The patched wheel from `source` (default: the pinned wheel, downloaded and sha256-checked),
    written into `out_dir` under its lock (waiting up to `wait` seconds for another run).
    `series_for_wheel` chooses the series."""
    verified = source is None
    return build_patched_wheel(series, source or fetch(series.pin.wheel, quiet=quiet), out_dir, verified, wait, on_wait)


def rebase(root: Path, tag: str | None = None, resume: bool = False, skip: bool = False,
           drops: tuple[str, ...] = (), reason: str | None = None, allow_new: tuple[str, ...] = (),
           abort: bool = False, repo: str | None = None, quiet: bool = False,
           on_recovered: Callable[[str], None] | None = None):
    """Start (TAG), go on (`resume`, `skip`, a `drops` of the stopped patch) or `abort` a rebase of
    the series in `root`. Returns the RebaseResult, or for `abort` whether one was in progress;
    a stop on a conflict raises RebaseConflict (carrying the result so far)."""
    from .lifecycle.rebase import Rebaser  # lazy: +~60 ms at start (GitPython ~30 ms of it)
    from .lifecycle.upstream_trees import UpstreamCache, get_tree

    stopped_drop = bool(drops) and not tag
    if sum(map(bool, (tag, resume, abort, skip, stopped_drop))) != 1:
        raise InputError("give a TAG, or --continue, --skip, --drop NAME, or --abort")
    if drops and not reason:
        raise InputError("--drop needs --reason TEXT (it is kept in dropped-patches)")
    if stopped_drop and len(drops) > 1:
        raise InputError("while a rebase is stopped, --drop names the stopped patch only")
    if allow_new and not resume:
        raise InputError("--allow-new-file goes with --continue")
    recovered = SeriesDir(root).recover()
    if recovered and on_recovered:
        on_recovered(recovered)
    series = load_series(root)
    cache = UpstreamCache()
    rebaser = Rebaser(root, series, cache)
    if abort:
        return rebaser.abort()
    if resume or skip or stopped_drop:
        return rebaser.resume(allow_new, skip, drops[0] if stopped_drop else None, reason)
    old = get_tree(series.pin.tag, repo, quiet=quiet, cache=cache)
    new = get_tree(tag or "", repo, quiet=quiet, cache=cache)
    return rebaser.start(tag or "", old, new, {name: reason or "" for name in drops})


def author(root: Path, upstream: str | None = None, quiet: bool = False):
    """The authoring commands' worker (refresh, new, import) on the series in `root`, over the
    pinned base from the upstream cache."""
    from .lifecycle.authoring import Author  # lazy: +~40 ms at start (GitPython ~30 ms of it)
    from .lifecycle.upstream_trees import UpstreamCache, get_tree

    series = load_series(root)
    cache = UpstreamCache()
    base = get_tree(series.pin.tag, upstream, quiet=quiet, cache=cache)
    return Author(root, series, cache, base.commit)


def carried_files(root: Path) -> list[CarriedFile]:
    """The files the series in `root` adds whole that a newer line's patch of the same name adds too (each newer
    line, newest first: the current line, then the others by pinned release)."""
    series = load_series(root)
    others = [(line.name, line.load()) for line in lines_of(project_of(root)) if line.root.resolve() != root.resolve()]
    newer = [(name, other) for name, other in others
             if name == CURRENT or Version(other.pin.version) > Version(series.pin.version)]
    newer.sort(key=lambda item: (item[0] != CURRENT, tuple(-x for x in Version(item[1].pin.version).release)))
    return find_carried(series, newer)


def carry(root: Path, upstream: str | None = None, quiet: bool = False) -> tuple[list[CarriedFile], list]:
    """Rewrite the series' patches that add such a file with the newer line's text of it."""
    files = carried_files(root)
    if all(f.same for f in files):
        return files, []
    return files, author(root, upstream, quiet).carry(files)


def header(name: str | None, subject: str | None, author: str | None, origin: str | None = None,
           bug: str | None = None, forwarded: str | None = None) -> Header:
    """The DEP-3 header `new` and `import` give a patch, dated now (the trailers as ``authoring.trailers``
    writes them), so the CLI hands over its options and never builds a header itself."""
    from .lifecycle.authoring import trailers  # lazy: +~40 ms at start (GitPython ~30 ms of it)
    from .lifecycle.patchwriter import Header

    return Header(name or "", subject or "", author or "", formatdate(), trailers(origin, bug, forwarded))


def import_patches(root: Path, source: str, repo: Path | None, header_for: Callable[[bool], object],
                   unique: bool, upstream: str | None = None, quiet: bool = False) -> Iterator[object]:
    """Import a diff file, or each commit of the range `source` of `repo`, as patches at the end of
    the series; yields each one's result. `header_for(single)` makes a patch's header (the given
    name and subject only go to a single patch)."""
    from .lifecycle.authoring import Author, format_patches  # lazy: +~40 ms at start (GitPython)
    from .lifecycle.upstream_trees import UpstreamCache, get_tree

    if repo:
        mails = [m for m in re.split(r"(?m)^(?=From [0-9a-f]{40} )", format_patches(repo, source).decode()) if m]
    else:
        path = Path(source)
        if not path.is_file():
            raise InputError(f"{source} is not a file (give --repo for a commit range)")
        mails = [path.read_bytes().decode("utf-8", "surrogateescape")]
    if not mails:
        raise InputError(f"{source} holds no commit")
    cache = UpstreamCache()
    base = get_tree(load_series(root).pin.tag, upstream, quiet=quiet, cache=cache)
    for mail in mails:
        header = header_for(len(mails) == 1)
        # The base tree is found once; the series is read again, as each import appends to it.
        yield Author(root, load_series(root), cache, base.commit).import_diff(
            mail.encode("utf-8", "surrogateescape"), header.name or None, header, unique)


def doctor(home: SeriesHome, python: str | None = None, target_spec: str | None = None,
           progress: Callable[[str], None] = lambda text: None, **options):
    """The install of `python` (default: this interpreter's) or `target_spec`, the GPUs and routes that
    interpreter sees, and the line's kernel checked there (``doctor.diagnose``; `options` are its own).
    Writes nothing but what ``status`` may (recovering an interrupted run)."""
    if target_spec:
        target = open_target(target_spec, "auto")
        where, fix = f"in {target_spec}", f"vllm-patch apply --target {target_spec}"
    elif python:
        target = open_target("", "auto", python)
        where, fix = f"in the site-packages of {python}", f"vllm-patch apply --python {python}"
    else:
        target = open_target("site-packages", "auto")
        where, fix = f"in the site-packages of {sys.executable} (vllm-patch's own interpreter)", \
            "vllm-patch apply --target site-packages"
    return doctor_room.diagnose(home, target, where, fix, python or sys.executable, python=python,
                                target_arg=target_spec, progress=progress, **options)


class PatchFailedWith(PatchFailed):
    """A patch did not apply: carries the outcome, so the CLI can show every state."""

    def __init__(self, outcome: Outcome) -> None:
        bad = [r for r in outcome.analysis.reports if not r.state.ok]
        first = bad[0] if bad else None
        message = f"{first.name} is {first.state.value}; nothing was changed" if first else \
            "the series does not apply; nothing was changed"
        super().__init__(message)
        self.outcome = outcome
