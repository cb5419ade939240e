"""Parse one patch file: a ``git format-patch`` mail with DEP-3-like trailers and a diff.

Everything here is pure: bytes in, a frozen `Patch` out, or an `InputError`
whose message names the patch, the file and the line at fault.
"""

from __future__ import annotations

import email.header
import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from unidiff import PatchSet, UnidiffParseError
from unidiff.constants import (
    LINE_TYPE_ADDED,
    LINE_TYPE_CONTEXT,
    LINE_TYPE_NO_NEWLINE,
    LINE_TYPE_REMOVED,
)

from ..errors import InputError

RE_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
RE_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.+)$")

FileKind = Literal["modify", "add", "delete"]


def split_lines(text: str) -> list[str]:
    """Split on ``\\n`` only, keeping terminators (``str.splitlines`` also splits on form feeds)."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


@dataclass(frozen=True)
class Hunk:
    """One hunk: its anchor (pre-image) and the lines that replace it (post-image).

    Lines keep their terminators (``\\n``, ``\\r\\n``, or none for a last line
    without newline), so matching is byte-exact.
    """

    index: int
    source_start: int
    target_start: int
    pre: tuple[str, ...]
    post: tuple[str, ...]

    def inverted(self) -> Hunk:
        return Hunk(self.index, self.target_start, self.source_start, self.post, self.pre)


@dataclass(frozen=True)
class FileDiff:
    """The changes a patch makes to one file."""

    path: str
    kind: FileKind
    hunks: tuple[Hunk, ...]
    mode: int = 0o644

    def inverted(self) -> FileDiff:
        kind: FileKind = {"add": "delete", "delete": "add", "modify": "modify"}[self.kind]  # type: ignore[assignment]
        return FileDiff(self.path, kind, tuple(h.inverted() for h in reversed(self.hunks)), self.mode)


@dataclass(frozen=True)
class Patch:
    """A parsed patch file: mail header, description, trailers and file diffs."""

    name: str
    subject: str
    author: str
    date: str
    description: str
    trailers: tuple[tuple[str, str], ...]
    files: tuple[FileDiff, ...]
    sha256: str
    raw: bytes

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def trailer(self, key: str) -> str | None:
        for k, v in self.trailers:
            if k.lower() == key.lower():
                return v
        return None

    def inverted(self) -> Patch:
        """The patch that undoes this one (files and hunks in reverse order)."""
        files = tuple(f.inverted() for f in reversed(self.files))
        return Patch(self.name, self.subject, self.author, self.date, self.description,
                     self.trailers, files, self.sha256, self.raw)


def decode_header(value: str) -> str:
    """RFC 2047 words decoded; an unknown or wrong charset keeps the raw text."""
    try:
        parts = email.header.decode_header(value)
        return "".join(p.decode(c or "utf-8") if isinstance(p, bytes) else p for p, c in parts)
    except (LookupError, UnicodeDecodeError, ValueError):
        return value


def mail_subject(value: str) -> str:
    """A mail's Subject as a patch subject: RFC 2047 words decoded and the ``[PATCH ...]``
    tag that ``git format-patch`` puts first (``[PATCH]``, ``[PATCH 2/5]``, ``[PATCH v2]``) dropped.
    The one rule for the series' patches and for imported mails."""
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", decode_header(value).strip())


def _plain_diff_start(lines: list[str]) -> int | None:
    """Where a unified diff without git headers starts: a ``--- ``/``+++ ``/``@@`` triple,
    with the ``Index:``/``====`` lines quilt and svn put before it."""
    for i in range(len(lines) - 2):
        if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ") and lines[i + 2].startswith("@@"):
            while i and (lines[i - 1].startswith("Index: ") or set(lines[i - 1].rstrip("\r\n")) == {"="}):
                i -= 1
            return i
    return None


def split_mail(name: str, text: str, plain: bool = False) -> tuple[dict[str, str], str, str]:
    """Split a format-patch mail into header fields, message body and diff text.
    `plain`: also take a unified diff without ``diff --git`` lines (quilt, ``diff -ruN``)."""
    lines = split_lines(text)
    start = next((i for i, line in enumerate(lines) if line.startswith("diff --git ")), None)
    if start is None and plain:
        start = _plain_diff_start(lines)
    if start is None:
        if any(line.startswith(("--- ", "+++ ", "@@ ")) for line in lines):
            raise InputError(f"{name}: diffs must be in git format ('diff --git a/... b/...' lines)")
        raise InputError(f"{name}: empty patch (no 'diff --git' section)")
    head, diff_lines = lines[:start], lines[start:]
    # Drop the mail signature ("-- " then the git version) that format-patch appends.
    for i in range(len(diff_lines) - 1, -1, -1):
        if diff_lines[i].rstrip("\r\n") == "-- ":
            if all(not line.startswith(("diff ", "@@", "+", "-", " ")) or line.strip() == ""
                   for line in diff_lines[i + 1:]):
                diff_lines = diff_lines[:i]
            break
    fields: dict[str, str] = {}
    i = 0
    if head and head[0].startswith("From ") and len(head[0].split()) >= 2:
        i = 1
    last = None
    while i < len(head) and head[i].strip():
        line = head[i].rstrip("\r\n")
        if line[:1] in (" ", "\t") and last:
            fields[last] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            last = key.strip().lower()
            fields[last] = value.strip()
        i += 1
    body = "".join(head[i:])
    # The description ends at the '---' line that precedes the diffstat.
    m = re.search(r"^---\s*$", body, flags=re.M)
    if m:
        body = body[: m.start()]
    return fields, body.strip("\n"), "".join(diff_lines)


def parse_trailers(description: str) -> tuple[tuple[str, str], ...]:
    """DEP-3-like trailers: ``Key: value`` lines in the last paragraph of the description."""
    paragraphs = description.strip().split("\n\n")
    found = []
    for line in paragraphs[-1].splitlines() if paragraphs else []:
        m = RE_TRAILER.match(line.strip())
        if m:
            found.append((m.group(1), m.group(2).strip()))
    return tuple(found)


def check_path(name: str, path: str) -> str:
    """Refuse paths that could leave the target tree."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise InputError(f"{name}: unsafe path {path!r} (absolute or malformed)")
    parts = PurePosixPath(path).parts
    if any(p in ("..", ".") for p in parts) or path.startswith("./"):
        raise InputError(f"{name}: unsafe path {path!r} ('..' or '.' component)")
    if any(p.lower() == ".git" for p in parts):
        raise InputError(f"{name}: unsafe path {path!r} (inside a '.git' directory)")
    return str(PurePosixPath(path))


def _strip_prefix(path: str, prefix: str) -> str:
    if path.startswith('"'):
        raise InputError(f"quoted path {path!r} is not supported")
    return path[len(prefix):] if path.startswith(prefix) else path


def _strip_p1(path: str) -> str:
    """A plain diff's path with its first component dropped, as ``patch -p1`` and ``git apply`` do."""
    if path.startswith('"'):
        raise InputError(f"quoted path {path!r} is not supported")
    if path.startswith("/") or "/" not in path:
        raise InputError(f"unsafe path {path!r} (no leading directory to strip, as with patch -p1)")
    return path.split("/", 1)[1]


def _epoch(timestamp: str | None) -> bool:
    """``diff -N`` dates a missing file at the epoch."""
    return bool(timestamp) and timestamp.startswith(("1970-01-01", "1969-12-31"))


def _validate_raw_hunks(name: str, diff_text: str) -> None:
    """Catch what unidiff silently skips: malformed ``@@`` lines and binary diffs."""
    for no, line in enumerate(split_lines(diff_text), 1):
        line = line.rstrip("\r\n")
        if line.startswith("@@") and not RE_HUNK_HEADER.match(line):
            raise InputError(f"{name}: malformed hunk header at diff line {no}: {line[:60]!r}")
        if line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
            raise InputError(f"{name}: binary diffs are not supported (diff line {no})")
        if line.startswith(("rename from ", "copy from ", "similarity index ")):
            raise InputError(f"{name}: renames and copies are not supported (diff line {no}); "
                             "regenerate it with --no-renames")
        if line.startswith("old mode "):
            raise InputError(f"{name}: mode changes are not supported (diff line {no})")


def _file_line(name: str, line: str, no: int, prefix: str) -> str | None:
    """The path a section's ``---``/``+++`` line names without its ``a/``/``b/`` `prefix` (None for
    /dev/null); anything else is refused, as git apply refuses it."""
    value = line[4:]
    if value == "/dev/null":
        return None
    if not value.startswith(prefix):
        raise InputError(f"{name}: {line!r} (diff line {no}) names no {prefix}PATH or /dev/null")
    return value[len(prefix):]


def _check_git_sections(name: str, diff_text: str) -> None:
    """Each ``diff --git`` section with hunks has its ``--- a/PATH`` (or /dev/null) and ``+++ b/PATH``
    (or /dev/null) lines before its first hunk, naming the files of its ``diff --git`` line. git apply
    refuses a section without them and GNU patch takes the paths from them: a section where they lack
    or contradict could patch another file than the one reviewed. A CRLF patch (one converted to
    Windows line ends: its ``diff --git`` lines end in CR) is refused as such."""
    lines = split_lines(diff_text)
    starts = [i for i, line in enumerate(lines) if line.startswith("diff --git ")]
    for k, start in enumerate(starts):
        head = lines[start]
        if head.endswith("\r\n"):
            raise InputError(f"{name}: CRLF line ends (diff line {start + 1}): the patch was saved with Windows line "
                             "ends; convert it back to LF (dos2unix, or check it out with core.autocrlf false)")
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        hunk = next((i for i in range(start + 1, end) if lines[i].startswith("@@")), None)
        if hunk is None:
            continue  # no content (an empty new file, a mode change): git writes no ---/+++ lines
        header = [(i, lines[i].rstrip("\n")) for i in range(start + 1, hunk)]
        minus = [(i, text) for i, text in header if text.startswith("--- ")]
        plus = [(i, text) for i, text in header if text.startswith("+++ ")]
        git_line = head.rstrip("\n")
        if len(minus) != 1 or len(plus) != 1 or minus[0][0] > plus[0][0]:
            missing = "'+++ b/" if minus and not plus else "'--- a/"
            path = git_line.rsplit(" b/", 1)[-1]
            raise InputError(f"{name}: {path}: {missing}{path}' line missing (or not one '---' then one '+++') before "
                             f"its first hunk (diff line {hunk + 1}); git apply refuses such a section")
        source = _file_line(name, minus[0][1], minus[0][0] + 1, "a/")
        target = _file_line(name, plus[0][1], plus[0][0] + 1, "b/")
        expected = f"diff --git a/{source or target} b/{target or source}"
        if git_line != expected:
            wrong = minus[0] if source is not None and f"a/{source} " not in git_line + " " else plus[0]
            raise InputError(f"{name}: {wrong[1]!r} (diff line {wrong[0] + 1}) contradicts {git_line!r}; "
                             "regenerate the patch with git format-patch")


def _hunk_images(name: str, path: str, hunk, index: int) -> Hunk:
    pre: list[str] = []
    post: list[str] = []
    last_types: str | None = None
    for line in hunk:
        t = line.line_type
        if t == LINE_TYPE_NO_NEWLINE:
            if last_types is None:
                raise InputError(f"{name}: {path}: hunk {index}: stray 'No newline' marker")
            for target, kind in ((pre, "-"), (post, "+")):
                if kind in last_types and target and target[-1].endswith("\n"):
                    target[-1] = target[-1][:-2] if target[-1].endswith("\r\n") else target[-1][:-1]
            continue
        value = line.value
        if not value.endswith("\n"):
            value += "\n"
        if t == LINE_TYPE_CONTEXT:
            pre.append(value)
            post.append(value)
            last_types = "-+"
        elif t == LINE_TYPE_REMOVED:
            pre.append(value)
            last_types = "-"
        elif t == LINE_TYPE_ADDED:
            post.append(value)
            last_types = "+"
    return Hunk(index, hunk.source_start, hunk.target_start, tuple(pre), tuple(post))


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _check_blob(name: str, path: str, kind: FileKind, hunks: tuple[Hunk, ...], info: str) -> None:
    """A whole new or deleted file must hash to the blob id on its ``index`` line:
    this catches a patch cut off inside (or before) such a file's hunk."""
    m = re.search(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", info, flags=re.M)
    if not m:
        raise InputError(f"{name}: {path}: new or deleted file without an 'index' line (truncated patch?)")
    blob = m.group(2) if kind == "add" else m.group(1)
    lines = [line for h in hunks for line in (h.post if kind == "add" else h.pre)]
    actual = _git_blob_id("".join(lines).encode("utf-8"))
    if not actual.startswith(blob):
        raise InputError(f"{name}: {path}: the file's lines do not match its blob id {blob} "
                         "(truncated or hand-edited patch?)")


def parse_diff(name: str, diff_text: str, plain: bool = False) -> tuple[FileDiff, ...]:
    """Parse the diff part of a patch with unidiff, strictly. `plain`: a file's diff may lack
    git's headers (then paths lose their first component, p1, and new or deleted files are
    those on ``/dev/null`` or dated at the epoch by ``diff -N``)."""
    _check_git_sections(name, diff_text)
    _validate_raw_hunks(name, diff_text)
    try:
        patchset = PatchSet(split_lines(diff_text))
    except UnidiffParseError as exc:
        detail = " ".join(str(exc).split())
        raise InputError(f"{name}: malformed diff: {detail} (truncated patch or wrong line counts?)") from None
    expected = sum(1 for line in split_lines(diff_text) if line.startswith("@@"))
    if sum(len(f) for f in patchset) != expected:
        raise InputError(f"{name}: malformed diff: {expected} hunk headers but "
                         f"{sum(len(f) for f in patchset)} complete hunks")
    files: list[FileDiff] = []
    seen: set[str] = set()
    for pf in patchset:
        if pf.is_binary_file:
            raise InputError(f"{name}: binary diffs are not supported ({pf.path})")
        if pf.is_rename and str(pf.patch_info or "").startswith("diff --git "):
            raise InputError(f"{name}: renames are not supported ({pf.path})")
        info = str(pf.patch_info or "")
        git_style = info.startswith("diff --git ")
        if not git_style and not plain:
            raise InputError(f"{name}: diffs must be in git format ('diff --git a/... b/...' lines)")
        strip = (lambda p: _strip_prefix(p, "a/")) if git_style else _strip_p1
        try:
            source = strip(pf.source_file) if pf.source_file and pf.source_file != "/dev/null" else None
            target = (_strip_prefix(pf.target_file, "b/") if git_style else _strip_p1(pf.target_file)) \
                if pf.target_file and pf.target_file != "/dev/null" else None
        except InputError as exc:
            raise InputError(f"{name}: {exc.message}") from None
        # The kind comes from git's headers: unidiff also calls a hunk that fills an
        # empty file "added" and one that empties a file "removed".
        whole = len(pf) == 1
        epoch_add = not git_style and whole and pf[0].source_length == 0 and _epoch(pf.source_timestamp)
        epoch_del = not git_style and whole and pf[0].target_length == 0 and _epoch(pf.target_timestamp)
        if re.search(r"^new file mode ", info, flags=re.M) or pf.source_file == "/dev/null" or epoch_add:
            kind: FileKind = "add"
            path = target or pf.path
        elif re.search(r"^deleted file mode ", info, flags=re.M) or pf.target_file == "/dev/null" or epoch_del:
            kind = "delete"
            path = source or pf.path
        else:
            kind = "modify"
            path = target or pf.path
            if source and target and source != target:
                raise InputError(f"{name}: source {source!r} and target {target!r} differ")
            if not len(pf):
                raise InputError(f"{name}: {path}: no hunks")
        path = check_path(name, path)
        if path in seen:
            raise InputError(f"{name}: {path} appears twice in the patch")
        seen.add(path)
        hunks = tuple(_hunk_images(name, path, h, i) for i, h in enumerate(pf, 1))
        for h in hunks:
            if kind == "modify" and not h.pre and not (h.source_start == 0 and len(hunks) == 1):
                raise InputError(f"{name}: {path}: hunk {h.index} has no anchor (no context "
                                 "or removed lines); regenerate it with context")
            if kind == "add" and h.pre or kind == "delete" and h.post:
                raise InputError(f"{name}: {path}: hunk {h.index} does not match its file's "
                                 "new/deleted header")
        if kind != "modify" and (git_style or re.search(r"^index ", info, flags=re.M)):
            _check_blob(name, path, kind, hunks, info)
        mode = 0o644
        m = re.search(r"^(?:new|deleted) file mode (\d+)$", info, flags=re.M)
        if m and int(m.group(1), 8) & 0o111:
            mode = 0o755
        files.append(FileDiff(path, kind, hunks, mode))
    if not files:
        raise InputError(f"{name}: empty patch (no file changes)")
    return tuple(files)


def check_no_nul(name: str, text: str) -> None:
    """A NUL byte is binary data, never source: refuse the patch, wherever it sits."""
    at = text.find("\x00")
    if at >= 0:
        line = text.count("\n", 0, at) + 1
        raise InputError(f"{name}: NUL byte on line {line}: binary data in a patch is not supported")


def parse_patch(name: str, data: bytes) -> Patch:
    """Parse a patch file's bytes."""
    if not data.strip():
        raise InputError(f"{name}: empty patch file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 (byte {exc.start})") from None
    check_no_nul(name, text)
    fields, description, diff_text = split_mail(name, text)
    subject = mail_subject(fields.get("subject", ""))
    if not subject:
        raise InputError(f"{name}: no 'Subject:' header")
    return Patch(
        name=name,
        subject=subject,
        author=decode_header(fields.get("from", "")),
        date=fields.get("date", ""),
        description=description,
        trailers=parse_trailers(description),
        files=parse_diff(name, diff_text),
        sha256=hashlib.sha256(data).hexdigest(),
        raw=data,
    )
