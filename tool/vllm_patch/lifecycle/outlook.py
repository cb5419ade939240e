"""The outlook: each patch's fate on the pinned release and every newer one.

For every release, each patch is carried onto the release's tree the way
``rebase`` would carry it (`rebase.port`), twice:

- **stacked**: on the new base plus the earlier patches as they came through
  (a patch that conflicts is left out of the stack, as ``rebase --skip`` would);
- **alone**: on the pristine new base, without the earlier patches.

Fates: ``clean``, ``merged`` (3-way, checked), ``moved`` (its files moved upstream;
it goes through at the new paths, clean or merged), ``upstreamed``, ``obsolete``
(its ``Obsolete-If:`` checks hold), ``conflict`` (files and regions), ``gone``
(a file it changes was deleted upstream with no renamed successor). A patch some
of whose parts are obsolete there (``Obsolete-If: [part] ...``) is carried as
usual and marked ``◐``, its cell naming the parts that hold. Nothing in
the series is written; trees come from the cache repository (downloaded once).
The table, the Markdown and the JSON are `vllm_patch.report`'s (one place renders every command).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ..engine.analysis import Contents, analyze, touched
from ..engine.pin import Pin
from ..errors import DownloadError, InputError, PatchFailed
from ..infrastructure.downloads import index_files, index_url
from ..series import Series
from .merge3 import conflict_regions
from .obsolete import TESTS_DIR, Judge, project_test_runner, require_test_environment, validate
from .rebase import Port, Step, follow, port
from .upstream_trees import Moves, UpstreamCache, UpstreamTree, get_tree, version_of_tag


@dataclass
class Cell:
    """One patch on one release, stacked or alone."""

    state: str
    via: str = ""
    moved: dict[str, str] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)
    conflicts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    reason: str = ""
    partly: str = ""  # the parts of the patch the release makes unnecessary (its Obsolete-If parts)


def cell_of(done: Port) -> Cell:
    if done.gone:
        state = "gone"
    elif done.step is Step.CONFLICT:
        state = "conflict"
    elif done.step is Step.UPSTREAMED:
        state = "upstreamed"
    elif done.moved:
        state = "moved"
    else:
        state = done.step.value
    conflicts = {p: conflict_regions(done.result.get(p)) for p in done.conflicts}
    return Cell(state, done.step.value if state == "moved" else "", dict(done.moved), list(done.gone),
                conflicts, list(done.problems))


@dataclass
class Row:
    """One release: its tree, what moved, and each patch's cells."""

    version: str
    tree: UpstreamTree
    moves: Moves
    stacked: dict[str, Cell]
    alone: dict[str, Cell]
    seconds: float = 0.0


@dataclass
class Outlook:
    pin: Pin
    digest: str
    names: list[str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _norm(release: str) -> str:
    return version_of_tag(release.strip())


def index_releases(project: str = "vllm") -> list[str]:
    """The final releases that have an sdist on the index, oldest first."""
    versions = set()
    for entry in index_files(project, "the sdists"):
        name = entry.get("filename", "")
        if not name.startswith(f"{project}-") or not name.endswith(".tar.gz") or entry.get("yanked"):
            continue
        try:
            v = Version(name[len(project) + 1:-len(".tar.gz")])
        except InvalidVersion:
            continue
        if not v.is_prerelease and not v.is_devrelease:
            versions.add(v)
    return [str(v) for v in sorted(versions)]


def select_releases(pin: Pin, releases: list[str] | None, to: str | None, cache: UpstreamCache,
                    notes: list[str]) -> list[str]:
    """The releases to look at: `releases` as given, else the pin and every newer release
    on the index (up to `to`); with the index unreachable, the ones already cached."""
    if releases:
        return list(dict.fromkeys(_norm(r) for r in releases))
    pinned = Version(pin.version)
    last = Version(_norm(to)) if to else None
    if last is not None and last < pinned:
        raise InputError(f"--to {to} is older than the pinned release {pin.version}")
    try:
        known = index_releases()
    except DownloadError as exc:
        known = sorted(set(cache.cached_sdists()) | {pin.version}, key=Version)
        if len(known) <= 1:
            raise InputError(f"cannot list the releases: {exc.message}") from None
        notes.append(f"the index is unreachable; using the {len(known)} releases already in the cache")
    chosen = [v for v in known if Version(v) >= pinned and (last is None or Version(v) <= last)]
    if last is not None and str(last) not in chosen:
        raise InputError(f"--to {to}: vLLM {last} is not a release on {index_url()}/vllm/")
    return chosen


def carry(series: Series, old_base: Contents, stages: list[Contents], new_base: Contents, tag: str,
          moves: Moves, judge: Judge) -> tuple[dict[str, Cell], dict[str, Cell]]:
    """Every patch of the series on one new base, stacked and alone."""
    stacked: dict[str, Cell] = {}
    alone: dict[str, Cell] = {}
    now = dict(new_base)
    judge.prepare(list(series.patches))
    for i, patch in enumerate(series.patches):
        found = judge.judge(patch)
        if found is not None and found.whole:
            stacked[patch.name] = alone[patch.name] = Cell("obsolete", reason=found.reason)
            continue
        before, after = stages[i - 1] if i else old_base, stages[i]
        by_itself = port(patch, before, after, new_base, tag, moves)
        paths = follow(patch, moves).paths
        on_stack = by_itself if all(now.get(p) == new_base.get(p) for p in paths) else \
            port(patch, before, after, now, tag, moves)
        if on_stack.step in (Step.CLEAN, Step.MERGED):
            now.update(on_stack.result)
        stacked[patch.name], alone[patch.name] = cell_of(on_stack), cell_of(by_itself)
        if found is not None:
            stacked[patch.name].partly = alone[patch.name].partly = found.describe()
    return stacked, alone


def build_outlook(series: Series, cache: UpstreamCache, releases: list[str] | None = None, to: str | None = None,
                  repo: str | None = None, quiet: bool = False,
                  progress: Callable[[int, int, str], None] | None = None, root: Path | None = None) -> Outlook:
    """The outlook of `series` over the chosen releases (see the module's docstring)."""
    started = time.perf_counter()
    # The test checks run the project's tests/: an installed tool's bundled lines have none.
    tests_here = root is not None and (root / TESTS_DIR).is_dir()
    validate(list(series.patches), root if tests_here else None)  # refused before anything runs
    if tests_here:
        require_test_environment(root, list(series.patches))
    notes: list[str] = []
    not_run: dict[str, list[str]] = {}
    versions = select_releases(series.pin, releases, to, cache, notes)
    report = progress or (lambda done, total, what: None)
    report(0, len(versions), f"vLLM {series.pin.version} (the pin)")
    old = get_tree(series.pin.tag, repo, quiet=quiet, cache=cache)
    patches = list(series.patches)
    paths = touched(patches)
    old_base = cache.read(old.commit, paths)
    analysis = analyze(patches, old_base)
    if not analysis.consistent or analysis.applied:
        raise PatchFailed(f"the series does not apply to its own pin ({series.pin.tag}); run 'vllm-patch check' first")
    stages = [{**old_base, **analysis.stage(i)} for i in range(len(patches))]
    rows = []
    for k, version in enumerate(versions):
        report(k, len(versions), f"vLLM {version}")
        t0 = time.perf_counter()
        tag = f"v{version}"
        tree = get_tree(tag, repo, quiet=quiet, cache=cache)
        moves = cache.renames(old.commit, tree.commit, paths)
        new_base = cache.read(tree.commit, [moves.path(p) for p in paths])
        commit = tree.commit
        runner = project_test_runner(root, lambda c=commit: cache.checkout(c)) if tests_here else None
        judge = Judge(functools.partial(cache.read, tree.commit), runner, skip_tests=not tests_here)
        stacked, alone = carry(series, old_base, stages, new_base, tag, moves, judge)
        for name, checks in judge.not_run.items():
            not_run.setdefault(name, []).extend(c for c in checks if c not in not_run[name])
        rows.append(Row(version, tree, moves, stacked, alone, time.perf_counter() - t0))
    report(len(versions), len(versions), "done")
    if not_run:
        notes.append(f"the Obsolete-If test checks did not run ({root or 'the series'} has no {TESTS_DIR}/: an "
                     "installed vllm-patch bundles the lines, not the tests; run outlook in a checkout of vllm-patch "
                     "after 'make dev' to run them); the parts they judge are carried as still needed: "
                     + "; ".join(f"{name}: {', '.join(checks)}" for name, checks in not_run.items()))
    return Outlook(series.pin, series.digest, list(series.names), rows, notes, time.perf_counter() - started)
