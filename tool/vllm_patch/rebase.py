"""Rebase the series onto a new upstream tree.

For each patch, in order, on the new base: ``clean`` (applies as is),
``upstreamed`` (the new base already holds its result: dropped and logged),
``merged`` (a 3-way merge of old base, old patched and new base file: review
it), or ``conflict`` (stop; the files wait with conflict markers in a work tree
for ``--continue``, or ``--abort`` forgets the rebase). The series and the
patches are written only when every patch is through, in one journaled step.
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path

from .engine import Contents, State, analyze, classify, decode, encode, touched
from .errors import InputError, PatchFailed
from .merge3 import has_markers, merge_file
from .patchfile import Patch
from .patchwriter import Header, PatchWriter
from .pin import Artifact, Pin
from .series import PATCH_DIR, SERIES_FILE, Series
from .transaction import Journal, commit
from .upstream import index_files, indexed_artifact
from .upstream_trees import UpstreamCache, UpstreamTree

STATE_DIR = ".vllm-patch-rebase"
DROPPED_FILE = "dropped-patches"


class Step(str, enum.Enum):
    CLEAN = "clean"
    UPSTREAMED = "upstreamed"
    MERGED = "merged"
    CONFLICT = "conflict"


@dataclass
class PatchOutcome:
    name: str
    step: Step
    files: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    note: str = ""
    range_diff: str = ""


@dataclass
class RebaseResult:
    tag: str
    outcomes: list[PatchOutcome]
    pin: Pin | None = None
    done: bool = False
    work_dir: Path | None = None


class RebaseConflict(PatchFailed):
    """A patch needs a hand merge; the rebase waits for --continue or --abort."""

    def __init__(self, result: RebaseResult, message: str) -> None:
        super().__init__(message)
        self.result = result


def rebase_one(patch: Patch, old_before: Contents, old_after: Contents,
               new_before: Contents, tag: str) -> tuple[Step, Contents, list[str]]:
    """One patch on the new base: its step, the files it should produce there, and
    the files that conflict (their contents then hold conflict markers)."""
    paths = list(patch.paths)
    report, after = classify(patch, {p: decode(p, new_before.get(p)) for p in paths})
    if report.state is State.APPLIES:
        return Step.CLEAN, {p: encode(after[p]) for p in paths}, []
    if report.state is State.APPLIED:
        return Step.UPSTREAMED, {p: new_before.get(p) for p in paths}, []
    result: Contents = {}
    conflicts = []
    for rel in paths:
        ours, base, theirs = new_before.get(rel), old_before.get(rel), old_after.get(rel)
        if ours == theirs or base == theirs:
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
        return Step.CONFLICT, result, conflicts
    if all(result[p] == new_before.get(p) for p in paths):
        return Step.UPSTREAMED, result, []
    return Step.MERGED, result, []


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


def new_pin(tag: str, tree: UpstreamTree) -> Pin:
    """The pin of the new base: version and commit from the tree, artifacts from the index."""
    version = tree.version or tag.removeprefix("v")
    sdist = indexed_artifact("vllm", f"vllm-{version}.tar.gz")
    wheels = [f["filename"] for f in index_files("vllm", "wheels")
              if f.get("filename", "").startswith(f"vllm-{version}-") and f["filename"].endswith("x86_64.whl")
              and "manylinux" in f["filename"]]
    if not wheels:
        raise InputError(f"the index has no x86_64 manylinux wheel of vLLM {version}")
    wheel = indexed_artifact("vllm", sorted(wheels)[0])
    commit = (tree.upstream_commit or "").removeprefix("g") or tree.commit
    return Pin(version, tag, commit, Artifact(sdist.filename, sdist.sha256), wheel)


def series_text(old_text: str, pin: Pin, names: list[str]) -> str:
    """The series file with the new pin and names, other comment lines kept."""
    head = [line for line in old_text.splitlines() if line.startswith("#") and not line.startswith("#:")]
    pin_lines = [f"#: version = {pin.version}", f"#: tag = {pin.tag}", f"#: commit = {pin.commit}",
                 f"#: sdist = {pin.sdist.filename} sha256:{pin.sdist.sha256}",
                 f"#: wheel = {pin.wheel.filename} sha256:{pin.wheel.sha256}"]
    return "\n".join([*head, *pin_lines, *names]) + "\n"


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


class Rebaser:
    """Drives a rebase of the series in `root` and keeps its state between runs."""

    def __init__(self, root: Path, series: Series, cache: UpstreamCache) -> None:
        self.root = root
        self.series = series
        self.cache = cache
        self.state_dir = root / STATE_DIR

    def in_progress(self) -> bool:
        return (self.state_dir / "state.json").is_file()

    def start(self, tag: str, old: UpstreamTree, new: UpstreamTree) -> RebaseResult:
        if self.in_progress():
            raise InputError(f"a rebase is in progress ({self.state_dir}); use --continue or --abort")
        state = SavedState(tag, old.commit, new.commit, new.source, new.version, new.upstream_commit,
                           self.series.digest, 0, new.commit, [], {}, [])
        return self._run(state, resolved=None)

    def resume(self) -> RebaseResult:
        state = self._load()
        work = self.state_dir / "resolve"
        resolved: Contents = {}
        patch = self.series.patches[state.next_index]
        for rel in patch.paths:
            path = work / rel
            resolved[rel] = path.read_bytes() if path.is_file() else None
        still = [rel for rel in state.conflict_files if resolved.get(rel) and has_markers(resolved[rel] or b"")]
        if still:
            raise InputError(f"conflict markers remain in {', '.join(still)} (under {work}); resolve them first")
        return self._run(state, resolved)

    def abort(self) -> bool:
        if not self.state_dir.exists():
            return False
        shutil.rmtree(self.state_dir)
        return True

    def _load(self) -> SavedState:
        if not self.in_progress():
            raise InputError("no rebase in progress")
        try:
            state = SavedState(**json.loads((self.state_dir / "state.json").read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise InputError(f"{self.state_dir}/state.json is unreadable ({exc}); run rebase --abort") from None
        if state.series_sha != self.series.digest:
            raise InputError("the series changed since the rebase stopped; run rebase --abort and start again")
        return state

    def _save(self, state: SavedState, conflict: Contents) -> Path:
        """Write the stopped rebase's state and work tree in one rename."""
        tmp = Path(tempfile.mkdtemp(prefix=".rebase-", dir=self.root))
        for rel, data in conflict.items():
            if data is not None:
                (tmp / "resolve" / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / "resolve" / rel).write_bytes(data)
        (tmp / "state.json").write_text(json.dumps(asdict(state), indent=1))
        shutil.rmtree(self.state_dir, ignore_errors=True)
        os.replace(tmp, self.state_dir)
        return self.state_dir / "resolve"

    def _run(self, state: SavedState, resolved: Contents | None) -> RebaseResult:
        patches = list(self.series.patches)
        paths = touched(patches)
        old_base = self.cache.read(state.old_commit, paths)
        old = analyze(patches, old_base)
        if not old.consistent or old.applied:
            raise PatchFailed(f"the series does not apply to its own pin ({self.series.pin.tag}); "
                              "run 'vllm-patch check' first")
        writer = PatchWriter(self.cache, state.writer_parent)
        new_now = self.cache.read(state.writer_parent, paths)
        outcomes = [PatchOutcome(o["name"], Step(o["step"]), o["files"], o["conflicts"], o["note"], o["range_diff"])
                    for o in state.outcomes]
        texts = dict(state.texts)
        for i in range(state.next_index, len(patches)):
            patch = patches[i]
            old_before = {**old_base, **(old.stage(i - 1) if i else {})}
            old_after = {**old_base, **old.stage(i)}
            if resolved is not None and i == state.next_index:
                step, result, conflicts = Step.MERGED, resolved, []
                note = "merged by hand"
            else:
                step, result, conflicts = rebase_one(patch, old_before, old_after, new_now, state.tag)
                note = ""
            if step is Step.CONFLICT:
                state.next_index, state.writer_parent = i, writer.parent
                state.outcomes = [asdict(o) | {"step": o.step.value} for o in outcomes]
                state.texts, state.conflict_files = texts, conflicts
                work = self._save(state, result)
                outcomes.append(PatchOutcome(patch.name, step, list(patch.paths), conflicts))
                result_obj = RebaseResult(state.tag, outcomes, work_dir=work)
                raise RebaseConflict(result_obj, f"{patch.name} conflicts in {', '.join(conflicts)}: edit them under "
                                     f"{work}, remove the conflict markers, then run 'vllm-patch rebase "
                                     "--continue' (or 'vllm-patch rebase --abort')")
            outcome = PatchOutcome(patch.name, step, list(patch.paths), note=note)
            if step is not Step.UPSTREAMED:
                text = writer.write(Header.of(patch), result, modes={f.path: f.mode for f in patch.files})
                texts[patch.name] = text
                outcome.range_diff = range_diff(patch.raw.decode("utf-8"), text)
            new_now = {**new_now, **result}
            outcomes.append(outcome)
        tree = UpstreamTree(state.new_commit, state.version, state.upstream_commit, state.source)
        pin = new_pin(state.tag, tree)
        self._finish(pin, outcomes, texts)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return RebaseResult(state.tag, outcomes, pin, done=True)

    def _finish(self, pin: Pin, outcomes: list[PatchOutcome], texts: dict[str, str]) -> None:
        """Write the new series, patches and dropped-patches log in one journaled step."""
        kept = [o.name for o in outcomes if o.step is not Step.UPSTREAMED]
        changes: Contents = {}
        old_text = (self.root / SERIES_FILE).read_text()
        changes[SERIES_FILE] = series_text(old_text, pin, kept).encode()
        for name in kept:
            changes[f"{PATCH_DIR}/{name}"] = texts[name].encode("utf-8")
        dropped = [o.name for o in outcomes if o.step is Step.UPSTREAMED]
        if dropped:
            log = self.root / DROPPED_FILE
            text = log.read_text() if log.is_file() else "# Patches dropped because upstream has them.\n"
            for name in dropped:
                text += f"{name}\n  Applied-Upstream: {pin.tag} ({pin.commit[:12]})\n  Dropped: {date.today()}\n"
                changes[f"{PATCH_DIR}/{name}"] = None
            changes[DROPPED_FILE] = text.encode()
        current = {rel: (self.root / rel).read_bytes() if (self.root / rel).is_file() else None for rel in changes}
        commit(Journal(self.root, self.root / ".vllm-patch-journal"),
               {rel: data for rel, data in changes.items() if current[rel] != data})

