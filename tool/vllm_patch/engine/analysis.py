"""The engine: classify and apply a series on file contents held in memory.

No disk, git or pip here. Inputs are ``{path: bytes or None}`` (None: the file
does not exist); outputs are new contents and per-patch, per-hunk reports.
A hunk applies only where its anchor (context + removed lines) occurs exactly
once in the file as it stands after the earlier hunks and patches.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import InputError
from .anchors import find_block, splice, why_missing
from .patchfile import FileDiff, Patch, split_lines

Lines = list[str]
Contents = dict[str, "bytes | None"]


class State(str, enum.Enum):
    """Per-patch state on a target (the project's vocabulary)."""

    APPLIES = "applies"
    APPLIED = "applied"
    PARTIAL = "partial"
    AMBIGUOUS = "ambiguous"
    CONFLICT = "conflict"

    @property
    def ok(self) -> bool:
        return self in (State.APPLIES, State.APPLIED)


class HunkState(str, enum.Enum):
    PENDING = "pending"
    DONE = "done"
    AMBIGUOUS = "ambiguous"
    CONFLICT = "conflict"


ANCHOR_NOT_FOUND = "anchor not found"


@dataclass(frozen=True)
class HunkReport:
    """Where a hunk stands: the 1-based lines where its anchor and its result occur."""

    path: str
    index: int
    hint: int
    state: HunkState
    anchor_at: tuple[int, ...] = ()
    result_at: tuple[int, ...] = ()
    reason: str = ""

    def describe(self) -> str:
        where = f"{self.path} hunk {self.index} (@@ -{self.hint})"
        if self.state is HunkState.AMBIGUOUS:
            parts = []
            if len(self.anchor_at) > 1 or self.anchor_at and self.result_at:
                parts.append("anchor matches at lines " + ", ".join(map(str, self.anchor_at)))
            if self.result_at:
                parts.append("result matches at lines " + ", ".join(map(str, self.result_at)))
            return f"{where}: ambiguous: " + "; ".join(parts)
        if self.state is HunkState.CONFLICT:
            return f"{where}: conflict: {self.reason or ANCHOR_NOT_FOUND}"
        return f"{where}: {self.state.value}"

    @property
    def anchor_gone(self) -> bool:
        """A conflict because the hunk's anchor is nowhere in the file (not a whole-file mismatch)."""
        return self.state is HunkState.CONFLICT and self.reason.startswith(ANCHOR_NOT_FOUND)


@dataclass
class PatchReport:
    """A patch's state and its hunks' reports."""

    name: str
    state: State
    hunks: list[HunkReport] = field(default_factory=list)

    def problems(self) -> list[str]:
        return [h.describe() for h in self.hunks if h.state in (HunkState.AMBIGUOUS, HunkState.CONFLICT)]


def decode(path: str, data: bytes | None) -> Lines | None:
    """Bytes to lines with their terminators; refuse what is not UTF-8."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); refusing to patch it") from None
    return split_lines(text)


def encode(lines: Lines | None) -> bytes | None:
    """Lines (terminators kept) back to the bytes they came from; None stays None (no file)."""
    return None if lines is None else "".join(lines).encode("utf-8")


def _one_based(hits: list[int]) -> tuple[int, ...]:
    return tuple(h + 1 for h in hits)


def _unexplained(pre_hits: list[int], post_hits: list[int], pre: tuple[str, ...],
                 post: tuple[str, ...]) -> tuple[list[int], list[int]]:
    """Drop the matches of one image that lie inside a match of the other.

    A hunk that appends at the end of a file (or inserts at its start) has a
    post-image that contains its pre-image; one that deletes trailing lines has the
    reverse. Such a nested match says nothing about where else the image occurs.
    """
    if len(pre) < len(post):
        inner = {p + o for p in post_hits for o in find_block(post, pre)}
        return [h for h in pre_hits if h not in inner], post_hits
    if len(post) < len(pre):
        inner = {p + o for p in pre_hits for o in find_block(pre, post)}
        return pre_hits, [h for h in post_hits if h not in inner]
    return pre_hits, post_hits


def _classify_file(fd: FileDiff, lines: Lines | None) -> tuple[list[HunkReport], Lines | None]:
    """Classify a file's hunks in order, applying the pending ones as it goes."""
    reports: list[HunkReport] = []
    if fd.kind in ("add", "delete"):
        whole = [line for h in fd.hunks for line in (h.post if fd.kind == "add" else h.pre)]
        hint = fd.hunks[0].source_start if fd.hunks else 0
        if fd.kind == "add":
            pending, done, after = lines is None, lines == whole, whole
            reason = "the file already exists with other contents"
        else:
            pending, done, after = lines == whole, lines is None, None
            reason = "the file to delete has other contents"
        state = HunkState.PENDING if pending else HunkState.DONE if done else HunkState.CONFLICT
        reports.append(HunkReport(fd.path, 1, hint, state, reason="" if pending or done else reason))
        return reports, after if pending else lines
    if lines is None:
        for h in fd.hunks:
            reports.append(HunkReport(fd.path, h.index, h.source_start, HunkState.CONFLICT,
                                      reason="file does not exist"))
        return reports, None
    for h in fd.hunks:
        if not h.pre or not h.post:
            # Fills an empty file, or empties one: the hunk is the whole file.
            whole_pre, whole_post = list(h.pre), list(h.post)
            pending, done = lines == whole_pre, lines == whole_post
            state = HunkState.PENDING if pending else HunkState.DONE if done else HunkState.CONFLICT
            if pending:
                lines = whole_post
            reports.append(HunkReport(fd.path, h.index, h.source_start, state,
                                      reason="" if pending or done else "the file is not what the hunk expects"))
            continue
        pre, post = _unexplained(find_block(lines, h.pre), find_block(lines, h.post), h.pre, h.post)
        if len(pre) == 1 and not post:
            state = HunkState.PENDING
            lines = splice(lines, pre[0], len(h.pre), h.post)
        elif not pre and len(post) == 1:
            state = HunkState.DONE
        elif not pre and not post:
            state = HunkState.CONFLICT
        else:
            state = HunkState.AMBIGUOUS
        reason = f"{ANCHOR_NOT_FOUND}: {why_missing(lines, h.pre)}" if state is HunkState.CONFLICT else ""
        reports.append(HunkReport(fd.path, h.index, h.source_start, state,
                                  _one_based(pre), _one_based(post), reason))
    return reports, lines


def classify(patch: Patch, files: Mapping[str, Lines | None]) -> tuple[PatchReport, dict[str, Lines | None]]:
    """A patch's state on `files`, and the files as they are once it is applied.

    The returned contents are meaningful only when the state is APPLIES
    (they are then the patched files) or APPLIED (unchanged).
    """
    after: dict[str, Lines | None] = {}
    reports: list[HunkReport] = []
    for fd in patch.files:
        hunk_reports, new_lines = _classify_file(fd, files.get(fd.path))
        reports.extend(hunk_reports)
        after[fd.path] = new_lines
    states = {r.state for r in reports}
    if HunkState.AMBIGUOUS in states:
        state = State.AMBIGUOUS
    elif HunkState.CONFLICT in states:
        state = State.CONFLICT
    elif states == {HunkState.PENDING}:
        state = State.APPLIES
    elif states == {HunkState.DONE}:
        state = State.APPLIED
    else:
        state = State.PARTIAL
    merged = dict(files)
    if state is State.APPLIES:
        merged.update(after)
    return PatchReport(patch.name, state, reports), merged


@dataclass
class Analysis:
    """A series on a target: which patches are applied and what each state's files are.

    When `consistent`, the target holds the base plus the first `applied`
    patches; `base` and `patched` are then the contents without any patch and
    with all of them, and `stage(i)` the contents after patch i.
    """

    reports: list[PatchReport]
    consistent: bool
    applied: int = 0
    base: Contents = field(default_factory=dict)
    patched: Contents = field(default_factory=dict)
    stages: list[dict[str, Lines | None]] = field(default_factory=list, repr=False)

    def stage(self, i: int) -> Contents:
        """The contents after patch i (0-based); encoded on demand, as few need them."""
        return {p: encode(v) for p, v in self.stages[i].items()}

    @property
    def verdict(self) -> str:
        if not self.consistent:
            return "failed"
        if self.applied == len(self.reports):
            return "applied"
        return "applies" if self.applied == 0 else "partly applied"


Files = dict[str, "Lines | None"]


def _walk(patches: Sequence[Patch], files: Files) -> tuple[list[PatchReport], Files, list[Files]] | None:
    """Apply `patches` in order; None as soon as one does not apply."""
    reports, stages = [], []
    for patch in patches:
        report, files = classify(patch, files)
        if report.state is not State.APPLIES:
            return None
        reports.append(report)
        stages.append(files)
    return reports, files, stages


def _diagnose(patches: Sequence[Patch], files: dict[str, Lines | None]) -> list[PatchReport]:
    """Per-patch states when no consistent reading exists: walk forward, applying what applies."""
    reports = []
    for patch in patches:
        report, after = classify(patch, files)
        if report.state is State.APPLIES:
            files = after
        reports.append(report)
    return reports


def analyze(patches: Sequence[Patch], contents: Mapping[str, bytes | None]) -> Analysis:
    """Find k such that the target is the base plus the first k patches, trying
    all-applied and none-applied first; report every patch's state."""
    files = {p: decode(p, d) for p, d in contents.items()}
    n = len(patches)
    for k in dict.fromkeys([n, 0, *range(n - 1, 0, -1)]):
        undone = _walk([p.inverted() for p in reversed(patches[:k])], files)
        if undone is None:
            continue
        _, base_files, _ = undone
        forward = _walk(patches, base_files)
        if forward is None:
            continue
        fwd_reports, patched_files, stages = forward
        reports = [PatchReport(r.name, State.APPLIED if i < k else State.APPLIES, r.hunks)
                   for i, r in enumerate(fwd_reports)]
        # The patched tree must be what the target holds for the first k patches.
        if k and any(stages[k - 1].get(p) != files.get(p) for p in files):
            continue
        return Analysis(
            reports, True, k,
            base={p: encode(v) for p, v in base_files.items()},
            patched={p: encode(v) for p, v in patched_files.items()},
            stages=stages,
        )
    return Analysis(_diagnose(patches, files), False)


def touched(patches: Sequence[Patch]) -> list[str]:
    """Every path the patches touch, in first-seen order."""
    return list(dict.fromkeys(p for patch in patches for p in patch.paths))


def created_modes(patches: Sequence[Patch]) -> dict[str, int]:
    """The mode of each file the patches create (git's ``new file mode``)."""
    return {fd.path: fd.mode for patch in patches for fd in patch.files if fd.kind == "add"}
