"""Author patches: refresh one from an edited tree, start a new one, import a diff.

Every command computes the new patch text against the pinned base plus the
earlier patches, checks its anchors, and writes the series directory in one
journaled step (a refresh that finds no edit writes nothing).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace
from datetime import date
from email.utils import formatdate
from pathlib import Path

from ..engine.analysis import Analysis, Contents, HunkState, analyze, touched
from ..engine.carried import CarriedFile
from ..engine.patchfile import (
    Patch,
    check_no_nul,
    check_path,
    decode_header,
    mail_subject,
    parse_diff,
    parse_patch,
    split_mail,
)
from ..errors import InputError, PatchFailed
from ..infrastructure.transaction import SeriesDir, read_files
from ..series import PATCH_DIR, SERIES_FILE, Series
from .patchwriter import Header, PatchWriter
from .upstream_trees import UpstreamCache


@dataclass
class Authored:
    name: str
    changed: bool
    text: str
    notes: list[str]


def _slug(subject: str) -> str:
    words = "".join(c if c.isalnum() else "-" for c in subject).strip("-")
    return "-".join(filter(None, words.split("-")))[:52]


def next_name(series: Series, subject: str) -> str:
    return f"{len(series.patches) + 1:04d}-{_slug(subject) or 'patch'}.patch"


def patch_file_name(name: str) -> str:
    """`name` with the `.patch` suffix it lacks: `git am patches/*.patch` must see every patch."""
    return name if name.endswith(".patch") else f"{name}.patch"


class Author:
    """Patch authoring on the series in `root`, against its pinned base in the cache repository."""

    def __init__(self, root: Path, series: Series, cache: UpstreamCache, base_commit: str) -> None:
        self.root = root
        self.series = series
        self.cache = cache
        self.base_commit = base_commit

    def _before(self, index: int, paths: list[str]) -> Contents:
        """The files as the patches before `index` leave them on the pinned base."""
        patches = list(self.series.patches)[:index]
        all_paths = list(dict.fromkeys([*touched(patches), *paths]))
        base = self.cache.read(self.base_commit, all_paths)
        analysis = analyze(patches, base)
        if not analysis.consistent or analysis.applied:
            raise PatchFailed("the patches before this one do not apply to the pinned base; run 'vllm-patch check'")
        return {**base, **(analysis.stage(index - 1) if index else {})}

    def _text(self, before: Contents, after: Contents, header: Header, widen: bool,
              modes: dict[str, int] | None = None) -> str:
        writer = PatchWriter(self.cache, self.base_commit)
        writer.commit(before, "the series before this patch")
        return writer.write(header, after, widen, modes)

    def _save(self, changes: dict[str, bytes | None]) -> None:
        SeriesDir(self.root).write(changes)

    def _append(self, name: str, text: str) -> None:
        if name in self.series.names or (self.root / PATCH_DIR / name).exists():
            raise InputError(f"a patch named {name} already exists")
        check_path("name", name)
        series_text = (self.root / SERIES_FILE).read_text()
        if not series_text.endswith("\n"):
            series_text += "\n"
        self._save({f"{PATCH_DIR}/{name}": text.encode("utf-8"),
                    SERIES_FILE: (series_text + name + "\n").encode()})

    def refresh(self, name: str, tree: Path, unique: bool, extra: list[str]) -> Authored:
        """Regenerate patch `name` from `tree` (the base and the patches up to it, edited)."""
        if name not in self.series.names:
            raise InputError(f"no patch named {name} in the series")
        if self.series.source_of(name):
            raise InputError(f"{name} is carried from {self.series.source_of(name)}: refresh it in that line "
                             "(every line that carries it follows), or make it this line's own file first")
        index = self.series.names.index(name)
        patch = self.series.patches[index]
        paths = list(dict.fromkeys([*patch.paths, *(check_path("--file", p) for p in extra)]))
        before = self._before(index, paths)
        current = {**before, **analyze([patch], {p: before.get(p) for p in patch.paths}).patched}
        after = read_files(tree, paths)
        if all(after[p] == before.get(p) for p in paths):
            raise InputError(f"{tree} holds none of {name}'s changes ({', '.join(paths)} are as the patches "
                             "before it leave them): nothing to record; drop the patch from the series instead")
        if all(after[p] == current.get(p) for p in paths) and not unique:
            return Authored(name, False, patch.raw.decode("utf-8"), ["no edit: the patch is unchanged"])
        text = self._text({p: before.get(p) for p in paths}, after, Header.of(patch), unique,
                          {f.path: f.mode for f in patch.files})
        if text.encode("utf-8") == patch.raw:
            return Authored(name, False, text, ["the patch is unchanged"])
        self._save({f"{PATCH_DIR}/{name}": text.encode("utf-8")})
        return Authored(name, True, text, self._later_notes(index, name, text))

    def carry(self, files: list[CarriedFile]) -> list[Authored]:
        """Rewrite each patch that adds a file another line adds whole with that line's text of it (the patch's
        other changes and its header kept): ``engine.carried`` finds them."""
        done = []
        for name in dict.fromkeys(f.patch for f in files if not f.same):
            index = self.series.names.index(name)
            patch = self.series.patches[index]
            before = self._before(index, list(patch.paths))
            own = {p: before.get(p) for p in patch.paths}
            after = {**own, **analyze([patch], own).patched, **{f.path: f.text for f in files if f.patch == name}}
            text = self._text(own, after, Header.of(patch), False,
                              {f.path: f.mode for f in patch.files})
            self._save({f"{PATCH_DIR}/{name}": text.encode("utf-8")})
            self.series = replace(self.series, patches=tuple(
                parse_patch(name, text.encode("utf-8")) if i == index else p
                for i, p in enumerate(self.series.patches)))
            carried = ", ".join(f"{f.path} from {f.source}" for f in files if f.patch == name)
            done.append(Authored(name, True, text, [f"carried {carried}", *self._later_notes(index, name, text)]))
        return done

    def new(self, name: str | None, tree: Path, paths: list[str], header: Header, unique: bool) -> Authored:
        """A new patch at the end of the series: `paths` as they are in `tree`."""
        if not paths:
            raise InputError("name the files the new patch changes with --file PATH")
        paths = [check_path("--file", p) for p in paths]
        before = self._before(len(self.series.patches), paths)
        after = read_files(tree, paths)
        if all(after[p] == before.get(p) for p in paths):
            raise InputError(f"{', '.join(paths)} in {tree} are as the series leaves them: nothing to record")
        name = patch_file_name(name) if name else next_name(self.series, header.subject)
        text = self._text({p: before.get(p) for p in paths}, after, Header(name, header.subject, header.author,
                          header.date, header.description), unique)
        self._append(name, text)
        return Authored(name, True, text, [])

    def import_diff(self, data: bytes, name: str | None, header: Header, unique: bool) -> Authored:
        """A patch from a .diff/.patch file (e.g. a pull request's diff, a quilt patch, a plain
        ``diff -ruN``), appended to the series."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("the diff is not UTF-8") from None
        check_no_nul("import", text)
        fields, body, diff_text = split_mail("import", text, plain=True)
        subject = header.subject or mail_subject(fields.get("subject", ""))
        if not subject:
            raise InputError("the diff has no Subject: give --subject")
        files = parse_diff("import", diff_text, plain=True)
        paths = [f.path for f in files]
        before = self._before(len(self.series.patches), paths)
        probe = Patch("import", subject, "", "", "", (), files, "", b"")
        analysis = analyze([probe], {p: before.get(p) for p in paths})
        if not analysis.consistent or analysis.applied:
            raise PatchFailed(f"the diff does not apply uniquely on {self.series.pin.tag} plus the series: "
                              + self._why_not(analysis))
        description = "\n\n".join(filter(None, [body.strip(), header.description]))
        name = patch_file_name(name) if name else next_name(self.series, subject)
        author = header.author or decode_header(fields.get("from", "")) or "vllm-patch <vllm-patch@localhost>"
        full = Header(name, subject, author, header.date or fields.get("date", "") or formatdate(), description)
        text = self._text({p: before.get(p) for p in paths}, {p: analysis.patched.get(p) for p in paths}, full,
                          unique, {f.path: f.mode for f in files})
        self._append(name, text)
        return Authored(name, True, text, [])

    def _why_not(self, analysis: Analysis) -> str:
        """Why an imported diff does not apply, and the way forward for each kind of failure:
        more context helps an ambiguous anchor, never one that is gone."""
        reports = [h for r in analysis.reports for h in r.hunks]
        problems = [h.describe() for h in reports if h.state in (HunkState.AMBIGUOUS, HunkState.CONFLICT)]
        gone = any(h.anchor_gone for h in reports)
        if not problems:
            problems = [analysis.reports[0].state.value]
        if gone or not any(h.state is HunkState.AMBIGUOUS for h in reports):
            advice = (f"the diff was made against other sources: rebase it onto {self.series.pin.tag} plus the "
                      "series, or apply it to such a tree by hand and record it with 'vllm-patch new --from TREE'")
        else:
            advice = ("re-export it with more context (git diff -U10), or apply it to a tree by hand and record it "
                      "with 'vllm-patch new --from TREE'")
        return "; ".join(problems) + "; " + advice

    def _later_notes(self, index: int, name: str, text: str) -> list[str]:
        patches = list(self.series.patches)
        patches[index] = parse_patch(name, text.encode("utf-8"))
        analysis = analyze(patches, self.cache.read(self.base_commit, touched(patches)))
        if analysis.consistent:
            return []
        bad = [r.name for r in analysis.reports if not r.state.ok]
        return [f"later patches no longer apply: {', '.join(bad)}; refresh them too"]


def trailers(origin: str | None, bug: str | None, forwarded: str | None) -> str:
    """The DEP-3-like trailer paragraph of a new patch."""
    lines = [f"Origin: {origin or 'vendor'}"]
    if bug:
        lines.append(f"Bug: {bug}")
    lines.append(f"Forwarded: {forwarded or 'no'}")
    lines.append(f"Last-Update: {date.today().isoformat()}")
    return "\n".join(lines)


def format_patches(repo: Path, commits: str) -> bytes:
    """``git format-patch --stdout RANGE`` of a local checkout: one mail per commit."""
    proc = subprocess.run(["git", "-C", str(repo), "format-patch", "--stdout", "--no-renames", commits],
                          capture_output=True)
    if proc.returncode:
        raise InputError(f"git format-patch {commits} in {repo} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout
