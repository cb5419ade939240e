"""Rebase the series onto a new upstream tree.

For each patch, in order, on the new base: ``obsolete`` (its own
``Obsolete-If:`` checks hold there: dropped and logged; where only some of its
parts hold it is carried, and its outcome names them), ``clean`` (applies as
is), ``upstreamed`` (the new base already holds its result: dropped and logged),
``merged`` (a 3-way merge of old base, old patched and new base file, checked to
compile with no new undefined names: review it), or ``conflict`` (stop; the
files wait with conflict markers in a work tree for ``--continue``, ``--skip``
drops the patch, ``--abort`` forgets the rebase). Files upstream moved are
followed (git's rename detection in the cache repository); a file upstream
deleted is a conflict. The new pin comes from the index before any patch is
ported, and is kept with a stopped rebase. The series and the patches are
written only when every patch is through, in one journaled step.
"""

from __future__ import annotations

import difflib
import enum
import functools
import json
import os
import re
import shutil
import tempfile
import textwrap
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import date
from pathlib import Path

import git

from ..engine.analysis import Contents, State, analyze, classify, decode, encode, touched
from ..engine.patchfile import Patch
from ..engine.pin import Artifact, Pin
from ..errors import InputError, PatchFailed, RebaseConflict, UpstreamError
from ..infrastructure.downloads import index_files, indexed_artifact
from ..infrastructure.transaction import SeriesDir
from ..series import PATCH_DIR, SERIES_FILE, Series, parse_series_text, project_of, render_series
from .merge3 import conflict_regions, marker_lines, merge_file
from .obsolete import Judge, project_test_runner, validate
from .patchwriter import Header, PatchWriter
from .pycheck import check_files
from .upstream_trees import Moves, UpstreamCache, UpstreamTree

STATE_DIR = ".vllm-patch-rebase"
DROPPED_FILE = "dropped-patches"


class Step(str, enum.Enum):
    CLEAN = "clean"
    UPSTREAMED = "upstreamed"
    OBSOLETE = "obsolete"
    MERGED = "merged"
    CONFLICT = "conflict"
    DROPPED = "dropped"


DROPS = (Step.UPSTREAMED, Step.OBSOLETE, Step.DROPPED)


@dataclass
class PatchOutcome:
    name: str
    step: Step
    files: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    note: str = ""
    range_diff: str = ""
    moved: dict[str, str] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)
    regions: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class RebaseResult:
    tag: str
    outcomes: list[PatchOutcome]
    pin: Pin | None = None
    done: bool = False
    work_dir: Path | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Port:
    """A patch carried onto a new base: its step, the files it should produce there
    (by their path on the new base), and what stands in the way."""

    step: Step
    result: Contents
    conflicts: list[str] = field(default_factory=list)
    regions: int = 0
    moved: dict[str, str] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def follow(patch: Patch, moves: Moves | None) -> Patch:
    """The patch with its files at the paths they moved to."""
    if not moves or not any(f.path in moves.moved for f in patch.files):
        return patch
    files = tuple(replace(f, path=moves.path(f.path)) for f in patch.files)
    return replace(patch, files=files)


def port(patch: Patch, old_before: Contents, old_after: Contents, new_before: Contents, tag: str,
         moves: Moves | None = None, check: bool = True) -> Port:
    """One patch on the new base. `old_before`/`old_after` hold its files on the old base
    before and after it (old paths), `new_before` the new base's files (new paths: a file
    upstream moved is followed to where git's rename detection found it). A file it
    touches that upstream deleted is a conflict; a merged result must pass the checks of
    `pycheck` (it compiles, no new undefined names, no markers), or it is a conflict too."""
    moved = {f.path: moves.moved[f.path] for f in patch.files if moves and f.path in moves.moved}
    gone = [f.path for f in patch.files if moves and f.path in moves.gone and f.kind != "add"]
    followed = follow(patch, moves)
    old_path = {moves.path(f.path) if moves else f.path: f.path for f in patch.files}
    paths = list(followed.paths)
    if not gone:
        report, after = classify(followed, {p: decode(p, new_before.get(p)) for p in paths})
        if report.state is State.APPLIES:
            return Port(Step.CLEAN, {p: encode(after[p]) for p in paths}, moved=moved)
        if report.state is State.APPLIED:
            return Port(Step.UPSTREAMED, {p: new_before.get(p) for p in paths}, moved=moved)
    result: Contents = {}
    conflicts = []
    for rel in paths:
        ours, base, theirs = new_before.get(rel), old_before.get(old_path[rel]), old_after.get(old_path[rel])
        if rel in gone:
            result[rel] = None  # upstream deleted it: never brought back by itself
            conflicts.append(rel)
        elif ours == theirs or base == theirs:
            result[rel] = ours
        elif ours == base:
            result[rel] = theirs
        elif theirs is None or ours is None:
            result[rel] = ours if ours is not None else theirs
            conflicts.append(rel)
        else:
            merged, n = merge_file(ours, base or b"", theirs, (f"{tag} (new base)", "old base", patch.name))
            result[rel] = merged
            if n:
                conflicts.append(rel)
    if conflicts:
        regions = sum(max(1, conflict_regions(result[rel])) for rel in conflicts)
        return Port(Step.CONFLICT, result, conflicts, regions, moved, gone)
    if all(result[p] == new_before.get(p) for p in paths):
        return Port(Step.UPSTREAMED, result, moved=moved)
    problems = check_files(result, new_before) if check else []
    if problems:
        bad = list(dict.fromkeys(p.split(":", 1)[0] for p in problems))
        return Port(Step.CONFLICT, result, bad, 0, moved, gone, problems)
    return Port(Step.MERGED, result, moved=moved)


def rebase_one(patch: Patch, old_before: Contents, old_after: Contents,
               new_before: Contents, tag: str, moves: Moves | None = None) -> tuple[Step, Contents, list[str]]:
    """One patch on the new base: its step, the files it should produce there, and
    the files that conflict (their contents then hold conflict markers)."""
    done = port(patch, old_before, old_after, new_before, tag, moves)
    return done.step, done.result, done.conflicts


def _body(text: str) -> list[str]:
    """A patch's diff without line numbers and blob ids: what a range-diff compares."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("diff --git ")), len(lines))
    out = []
    for line in lines[start:]:
        if line == "-- ":
            break
        if line.startswith("index "):
            continue
        out.append("@@" if line.startswith("@@") else line)
    while out and not out[-1]:
        out.pop()
    return out


def range_diff(old: str, new: str) -> str:
    return "\n".join(difflib.unified_diff(_body(old), _body(new), "old", "new", lineterm="", n=2))


def _build_tag(filename: str) -> tuple[int, str]:
    """A wheel's build tag (``vllm-0.21.0-1-cp38-...whl`` -> (1, ""); none -> (-1, ""))."""
    parts = filename.removesuffix(".whl").split("-")
    if len(parts) == 6:
        m = re.match(r"(\d+)(.*)", parts[2])
        return (int(m.group(1)), m.group(2)) if m else (-1, parts[2])
    return (-1, "")


def new_pin(tag: str, tree: UpstreamTree, notes: list[str] | None = None) -> Pin:
    """The pin of the new base: version and commit from the tree, artifacts from the index.

    The commit is the full id when the tree came from git, else the short id the sdist's
    ``vllm/_version.py`` names (said so in `notes`). Of several x86_64 manylinux wheels
    of the release (rebuilds carry a build tag), the one pip prefers: the highest build tag."""
    notes = notes if notes is not None else []
    version = tree.version or tag.removeprefix("v")
    sdist = indexed_artifact("vllm", f"vllm-{version}.tar.gz")
    wheels = [f["filename"] for f in index_files("vllm", "wheels")
              if f.get("filename", "").startswith(f"vllm-{version}-") and f["filename"].endswith("x86_64.whl")
              and "manylinux" in f["filename"] and not f.get("yanked")]
    if not wheels:
        raise InputError(f"the index has no x86_64 manylinux wheel of vLLM {version}")
    chosen = sorted(wheels, key=lambda w: (_build_tag(w), w))[-1]
    if len(wheels) > 1:
        others = ", ".join(w for w in sorted(wheels) if w != chosen)
        notes.append(f"wheel: the index lists {len(wheels)} x86_64 manylinux wheels of vLLM {version}; pinned "
                     f"{chosen}, the one pip prefers (highest build tag), not {others}")
    wheel = indexed_artifact("vllm", chosen)
    named = (tree.upstream_commit or "").strip()
    if named.startswith("g") and len(named) > 7:
        named = named[1:]
    if tree.source.startswith("PyPI sdist") or not re.fullmatch(r"[0-9a-f]{40}", named):
        if not re.fullmatch(r"[0-9a-f]{7,40}", named):
            raise InputError(f"vLLM {version}'s vllm/_version.py names no commit id ({tree.upstream_commit!r}); "
                             "rebase with --repo (a vLLM checkout) to pin one")
        if len(named) < 40:
            notes.append(f"commit: {named} is the short id vLLM {version}'s sdist names (vllm/_version.py: "
                         f"g{named}); the sdist holds no full id: rebase with --repo (a vLLM checkout or URL) to "
                         "pin the full one")
    return Pin(version, tag, named.lower(), Artifact(sdist.filename, sdist.sha256), wheel)


def series_text(old_text: str, pin: Pin, names: list[str], comment: list[str] | None = None,
                sources: dict[str, str] | None = None) -> str:
    """The series file with the new pin and names, other comment lines kept.

    With `comment` (lines without their ``#``), the header comment is rewritten for the
    new release: the comment lines from the paragraph that first names the old release
    (its version, tag or commit) up to the pin are replaced by `comment`."""
    head = [line for line in old_text.splitlines() if line.startswith("#") and not line.startswith("#:")]
    if comment is not None:
        fields, _ = parse_series_text(old_text)
        patterns = [rf"(?<![\w.]){re.escape(o)}(?!\w|\.\d)" for o in (fields.get("version"), fields.get("tag")) if o]
        if len(fields.get("commit", "")) >= 7:
            patterns.append(re.escape(fields["commit"][:7]))
        head = _before_pin(head, patterns)
        while head and head[-1].strip() == "#":
            head.pop()
        if head:
            head.append("#")
        head += [f"# {line}".rstrip() for line in comment]
    return render_series(head, pin, names, sources)


def _before_pin(head: list[str], patterns: list[str]) -> list[str]:
    """The header comment up to where the first sentence naming the old pin begins: that sentence may
    start a line or two above the line that names it, or after another sentence on the same line."""
    cut = next((i for i, line in enumerate(head) if any(re.search(p, line) for p in patterns)), len(head))
    if cut == len(head):
        return head
    start = cut
    while start > 0 and head[start - 1].strip() != "#" and not head[start - 1].rstrip().endswith((".", ":")):
        start -= 1
    first = head[start]
    if start == cut:
        first = first[:min(m.start() for p in patterns if (m := re.search(p, first)))]
    end = first.rfind(". ")
    return head[:start] + ([first[:end + 1]] if end > 1 else [])


def pin_comment(old: Pin, pin: Pin, source: str, notes: list[str]) -> list[str]:
    """The series header's description of a new pin."""
    lines = [f"Rebased from vLLM {old.version} onto {pin.version} (tag {pin.tag}) with `vllm-patch rebase`",
             f"on {date.today()}; trees from {source}."]
    for note in notes:
        lines += textwrap.wrap(note[0].upper() + note[1:] + ("" if note.endswith(".") else "."), 88)
    return lines


@dataclass
class SavedState:
    """What a stopped rebase needs to go on (``.vllm-patch-rebase/state.json``)."""

    tag: str
    old_commit: str
    new_commit: str
    source: str
    version: str | None
    upstream_commit: str | None
    series_sha: str
    next_index: int
    writer_parent: str
    outcomes: list[dict]
    texts: dict[str, str]
    conflict_files: list[str]
    moves: dict = field(default_factory=dict)
    drops: dict[str, str] = field(default_factory=dict)
    # The new pin, looked up on the index when the rebase starts (None in a state written before it was
    # kept here: then it is looked up at the end).
    pin: dict | None = None
    pin_notes: list[str] = field(default_factory=list)


def _pin_from(data: dict) -> Pin:
    return Pin(data["version"], data["tag"], data["commit"], Artifact(**data["sdist"]), Artifact(**data["wheel"]))


def _outcome(data: dict) -> PatchOutcome:
    known = {f.name for f in fields(PatchOutcome)}
    return PatchOutcome(**{k: v for k, v in data.items() if k in known} | {"step": Step(data["step"])})


class Rebaser:
    """Drives a rebase of the series in `root` and keeps its state between runs."""

    def __init__(self, root: Path, series: Series, cache: UpstreamCache) -> None:
        self.root = root
        self.series = series
        self.cache = cache
        self.state_dir = root / STATE_DIR

    def in_progress(self) -> bool:
        return (self.state_dir / "state.json").is_file()

    def start(self, tag: str, old: UpstreamTree, new: UpstreamTree,
              drops: dict[str, str] | None = None) -> RebaseResult:
        """Rebase onto `new`; `drops` names patches to leave out, each with its reason."""
        if self.in_progress():
            raise InputError(f"a rebase is in progress ({self.state_dir}); use --continue or --abort")
        unknown = [n for n in drops or {} if n not in self.series.names]
        if unknown:
            raise InputError(f"--drop {unknown[0]}: no such patch in the series")
        validate(list(self.series.patches), project_of(self.root))
        # The index first: a release it does not have stops here, before any patch is ported or resolved,
        # and a stopped rebase goes on without the network.
        notes: list[str] = []
        pin = new_pin(tag, new, notes)
        moves = self.cache.renames(old.commit, new.commit, list(self.series.touched_paths()))
        state = SavedState(tag, old.commit, new.commit, new.source, new.version, new.upstream_commit,
                           self.series.digest, 0, new.commit, [], {}, [], moves.as_dict(), dict(drops or {}),
                           asdict(pin), notes)
        return self._run(state, resolved=None)

    def resume(self, allow_new: tuple[str, ...] | list[str] = (), skip: bool = False, drop: str | None = None,
               reason: str | None = None) -> RebaseResult:
        """Go on after a stop: with the hand resolution under ``resolve/`` (checked first),
        or without the stopped patch (`skip`, or `drop` naming it), logged with `reason`."""
        state = self._load()
        validate(list(self.series.patches), project_of(self.root))
        patch = self.series.patches[state.next_index]
        if drop is not None and drop != patch.name:
            raise InputError(f"--drop {drop}: the rebase stopped at {patch.name}; only the stopped patch can be "
                             "dropped now (drop others with --drop when starting the rebase)")
        if skip or drop is not None:
            return self._run(state, resolved=None, skip=reason or "skipped by hand (rebase --skip)")
        resolved = self._resolution(state, patch, tuple(allow_new))
        return self._run(state, resolved)

    def _resolution(self, state: SavedState, patch: Patch, allow_new: tuple[str, ...]) -> Contents:
        """The files under ``resolve/``, refused unless they check: no markers, Python that
        compiles with no new undefined names, no file the new base lacks (a moved or deleted
        one brought back) unless the patch creates it or --allow-new-file names it."""
        moves = Moves.from_dict(state.moves)
        followed = follow(patch, moves)
        work = self.state_dir / "resolve"
        resolved: Contents = {rel: None for rel in followed.paths}
        if work.is_dir():
            for path in sorted(work.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    resolved[path.relative_to(work).as_posix()] = path.read_bytes()
        markers = [f"{rel}:{n}" for rel, data in resolved.items() if data is not None for n in marker_lines(data)]
        if markers:
            more = f" (and {len(markers) - 8} more)" if len(markers) > 8 else ""
            raise InputError(f"conflict markers remain in {', '.join(markers[:8])}{more} (under {work}); "
                             "resolve them first")
        base = self.cache.read(state.writer_parent, list(resolved))
        created = {f.path for f in followed.files if f.kind == "add"}
        for rel, data in resolved.items():
            if data is None or base[rel] is not None or rel in created or rel in allow_new:
                continue
            if rel in moves.moved:
                why = f"{state.tag} moved it to {moves.moved[rel]}: put the changes there"
            elif rel in moves.gone:
                why = f"{state.tag} deleted it: port the changes to the code that replaced it, or leave them out"
            else:
                why = f"{state.tag} has no such file and {patch.name} does not create it"
            raise InputError(f"the resolution re-creates {rel} ({why}); remove {work / rel}, or pass "
                             f"--allow-new-file {rel} if the patch should create it")
        problems = check_files(resolved, base)
        if problems:
            more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
            raise InputError(f"the resolution under {work} does not check: {'; '.join(problems[:8])}{more}")
        return resolved

    def abort(self) -> bool:
        if not self.state_dir.exists():
            return False
        shutil.rmtree(self.state_dir)
        return True

    def _load(self) -> SavedState:
        if not self.in_progress():
            raise InputError(f"no rebase in progress for the series in {self.root} (a rebase started with "
                             "--series DIR or --line NAME needs the same option with --continue and --abort)")
        try:
            state = SavedState(**json.loads((self.state_dir / "state.json").read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise InputError(f"{self.state_dir}/state.json is unreadable ({exc}); run rebase --abort") from None
        if state.series_sha != self.series.digest:
            raise InputError("the series changed since the rebase stopped; run rebase --abort and start again")
        return state

    def _save(self, state: SavedState, conflict: Contents, reference: dict[str, Contents]) -> Path:
        """Write the stopped rebase's state and work tree in one rename."""
        tmp = Path(tempfile.mkdtemp(prefix=".rebase-", dir=self.root))
        for top, files in {"resolve": conflict, **reference}.items():
            for rel, data in files.items():
                if data is not None:
                    (tmp / top / rel).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / top / rel).write_bytes(data)
        (tmp / "state.json").write_text(json.dumps(asdict(state), indent=1))
        shutil.rmtree(self.state_dir, ignore_errors=True)
        os.replace(tmp, self.state_dir)
        return self.state_dir / "resolve"

    def _obsolete(self, state: SavedState) -> Judge:
        read = functools.partial(self.cache.read, state.new_commit)
        return Judge(read, project_test_runner(project_of(self.root), lambda: self.cache.checkout(state.new_commit)))

    def _run(self, state: SavedState, resolved: Contents | None, skip: str | None = None) -> RebaseResult:
        patches = list(self.series.patches)
        paths = touched(patches)
        old_base = self.cache.read(state.old_commit, paths)
        old = analyze(patches, old_base)
        if not old.consistent or old.applied:
            raise PatchFailed(f"the series does not apply to its own pin ({self.series.pin.tag}); "
                              "run 'vllm-patch check' first")
        moves = Moves.from_dict(state.moves)
        judge = self._obsolete(state)
        judge.prepare(patches[state.next_index:])
        writer = PatchWriter(self.cache, state.writer_parent)
        outcomes = [_outcome(o) for o in state.outcomes]
        texts = dict(state.texts)
        for i in range(state.next_index, len(patches)):
            patch = patches[i]
            resumed = i == state.next_index
            followed = follow(patch, moves)
            if resumed and skip is not None:
                outcomes.append(PatchOutcome(patch.name, Step.DROPPED, list(followed.paths), note=skip))
                continue
            if patch.name in state.drops:
                outcomes.append(PatchOutcome(patch.name, Step.DROPPED, list(followed.paths),
                                             note=state.drops[patch.name]))
                continue
            old_before = {**old_base, **(old.stage(i - 1) if i else {})}
            old_after = {**old_base, **old.stage(i)}
            if resumed and resolved is not None:
                before = self.cache.read(writer.parent, list(resolved))
                if all(resolved[p] == before[p] for p in resolved):
                    outcomes.append(PatchOutcome(patch.name, Step.DROPPED, list(followed.paths),
                                                 note="the resolution leaves no change"))
                    continue
                done = Port(Step.MERGED, resolved)
                note = "resolved by hand"
            else:
                found = judge.judge(patch)
                if found is not None and found.whole:
                    outcomes.append(PatchOutcome(patch.name, Step.OBSOLETE, list(followed.paths),
                                                 note=found.reason))
                    continue
                new_before = self.cache.read(writer.parent, list(followed.paths))
                done = port(patch, old_before, old_after, new_before, state.tag, moves)
                note = found.describe() if found is not None else ""
            moved_note = "; ".join(f"{a} -> {b}" for a, b in done.moved.items())
            if moved_note:
                note = f"moved: {moved_note}" + (f"; {note}" if note else "")
            if done.step is Step.CONFLICT:
                state.next_index, state.writer_parent = i, writer.parent
                state.outcomes = [asdict(o) | {"step": o.step.value} for o in outcomes]
                state.texts, state.conflict_files = texts, done.conflicts
                ref_paths = list(patch.paths)
                reference = {"reference/old-base": {p: old_before.get(p) for p in ref_paths},
                             "reference/old-patched": {p: old_after.get(p) for p in ref_paths}}
                work = self._save(state, done.result, reference)
                outcomes.append(PatchOutcome(patch.name, done.step, list(followed.paths), done.conflicts, note,
                                             moved=done.moved, gone=done.gone, regions=done.regions,
                                             problems=done.problems))
                result_obj = RebaseResult(state.tag, outcomes, work_dir=work)
                raise RebaseConflict(result_obj, self._conflict_message(patch, done, work, state.tag))
            outcome = PatchOutcome(patch.name, done.step, list(followed.paths), note=note, moved=done.moved)
            if done.step not in DROPS:
                try:
                    text = writer.write(Header.of(patch), done.result,
                                        modes={f.path: f.mode for f in followed.files})
                except git.GitCommandError as exc:
                    raise UpstreamError(f"git failed writing {patch.name}: {' '.join(str(exc.stderr).split())}") \
                        from None
                texts[patch.name] = text
                outcome.range_diff = range_diff(patch.raw.decode("utf-8"), text)
            outcomes.append(outcome)
        if state.pin is not None:
            pin, notes = _pin_from(state.pin), list(state.pin_notes)
        else:
            notes = []
            pin = new_pin(state.tag, UpstreamTree(state.new_commit, state.version, state.upstream_commit,
                                                  state.source), notes)
        self._finish(pin, outcomes, texts, pin_comment(self.series.pin, pin, state.source, notes))
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return RebaseResult(state.tag, outcomes, pin, done=True, notes=notes)

    @staticmethod
    def _conflict_message(patch: Patch, done: Port, work: Path, tag: str) -> str:
        parts = []
        for rel in done.conflicts:
            if rel in done.gone:
                parts.append(f"{rel} was deleted upstream in {tag} (no renamed file found; the patch's version is "
                             f"under {work.parent / 'reference'})")
            else:
                parts.append(rel)
        what = "; ".join(parts)
        if done.problems:
            shown = "; ".join(done.problems[:8])
            return (f"{patch.name} merged, but the result does not check: {shown}: fix it under {work}, then run "
                    "'vllm-patch rebase --continue' (or --skip, or --abort)")
        regions = f" ({done.regions} region{'s' if done.regions != 1 else ''})" if done.regions else ""
        return (f"{patch.name} conflicts in {what}{regions}: edit them under {work}, remove the conflict markers, "
                "then run 'vllm-patch rebase --continue' (or --skip, or --abort)")

    def _finish(self, pin: Pin, outcomes: list[PatchOutcome], texts: dict[str, str], comment: list[str]) -> None:
        """Write the new series, patches and dropped-patches log in one journaled step."""
        kept = [o.name for o in outcomes if o.step not in DROPS]
        changes: Contents = {}
        old_text = (self.root / SERIES_FILE).read_text()
        # A patch carried from another line stays a reference while it applies to the new base as it is (clean:
        # the other line's file still applies, at other positions at most); one the port had to change becomes
        # this line's own file.
        raw = {p.name: p.raw for p in self.series.patches}
        as_is = {o.name for o in outcomes if o.step is Step.CLEAN}
        sources = {n: src for n, src in self.series.sources
                   if n in kept and (n in as_is or texts[n].encode("utf-8") == raw[n])}
        changes[SERIES_FILE] = series_text(old_text, pin, kept, comment, sources).encode()
        for name in kept:
            if name not in sources:
                changes[f"{PATCH_DIR}/{name}"] = texts[name].encode("utf-8")
        dropped = [o for o in outcomes if o.step in DROPS]
        if dropped:
            log = self.root / DROPPED_FILE
            text = log.read_text() if log.is_file() else \
                "# Patches dropped from the series: upstreamed, obsolete, or dropped by hand in a rebase.\n"
            at = f"{pin.tag} ({pin.commit[:12]})"
            for o in dropped:
                if o.step is Step.UPSTREAMED:
                    why = f"Applied-Upstream: {at}"
                elif o.step is Step.OBSOLETE:
                    why = f"Obsolete-In: {at}: {o.note}"
                else:
                    why = f"Dropped-By-Hand: rebasing onto {at}: {o.note}"
                text += f"{o.name}\n  {why}\n  Dropped: {date.today()}\n"
                changes[f"{PATCH_DIR}/{o.name}"] = None
            changes[DROPPED_FILE] = text.encode()
        SeriesDir(self.root).write(changes)
