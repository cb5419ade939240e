"""Write patch mails with git: the contents become a commit (author, date and message
of the patch) in the cache repository, then ``git format-patch`` prints it, with the
least context (3 lines or more) that makes every anchor unique."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import parseaddr

import git

from ..engine.analysis import Contents, analyze
from ..engine.patchfile import Patch, parse_patch
from ..errors import PatchFailed, UpstreamError
from ..infrastructure.gitindex import private_index, stage
from .upstream_trees import UpstreamCache

MAX_CONTEXT = 40


@contextmanager
def git_errors(what: str) -> Iterator[None]:
    """A failed git command as a one-line UpstreamError naming what was being done."""
    try:
        yield
    except git.GitCommandError as exc:
        detail = " ".join(str(exc.stderr or exc).split()) or f"exit status {exc.status}"
        raise UpstreamError(f"git failed while {what}: {detail}") from None


@dataclass(frozen=True)
class Header:
    """What a patch mail says about itself."""

    name: str
    subject: str
    author: str
    date: str = ""
    description: str = ""

    @classmethod
    def of(cls, patch: Patch) -> Header:
        return cls(patch.name, patch.subject, patch.author, patch.date, patch.description)


class PatchWriter:
    """Chains commits on `base_commit` in the cache repository and formats them."""

    def __init__(self, cache: UpstreamCache, base_commit: str) -> None:
        self.cache = cache
        self.repo = cache.repo
        self.parent = base_commit

    def commit(self, contents: Contents, message: str, author: str = "", date: str = "",
               modes: dict[str, int] | None = None) -> str:
        """A commit of `contents` on the current parent, which it becomes."""
        with git_errors(f"recording {message.splitlines()[0] if message else 'a patch'!r} in {self.cache.path}"):
            return self._commit(contents, message, author, date, modes)

    def _commit(self, contents: Contents, message: str, author: str, date: str,
                modes: dict[str, int] | None) -> str:
        with private_index(self.cache.path) as env:
            self.repo.git.read_tree(self.parent, env=env)
            kept = self._index_modes(env, list(contents))
            # A file the parent has keeps its mode (patches never change one; an
            # executable upstream file stays executable); a new file takes the
            # patch's mode, else 0644.
            stage(self.repo.git, env, contents, lambda rel: kept.get(rel) or (modes or {}).get(rel, 0o644))
            tree = self.repo.git.write_tree(env=env)
        name, email = parseaddr(author)
        who = {"GIT_AUTHOR_NAME": name or email or "unknown", "GIT_AUTHOR_EMAIL": email or "unknown@localhost",
               "GIT_COMMITTER_NAME": "vllm-patch", "GIT_COMMITTER_EMAIL": "vllm-patch@localhost"}
        if date:
            who["GIT_AUTHOR_DATE"] = date
        self.parent = self.repo.git.commit_tree(tree, "-p", self.parent, "-m", message, env=who)
        return self.parent

    def _index_modes(self, env: dict[str, str], paths: list[str]) -> dict[str, int]:
        """The permission bits the private index holds for `paths` (those it has)."""
        if not paths:
            return {}
        out = self.repo.git.ls_files("-s", "-z", "--", *paths, env=env, strip_newline_in_stdout=False)
        found: dict[str, int] = {}
        for entry in filter(None, out.split("\0")):
            meta, rel = entry.split("\t", 1)
            found[rel] = int(meta.split()[0], 8) & 0o777
        return found

    def write(self, header: Header, contents: Contents, widen: bool = True,
              modes: dict[str, int] | None = None) -> str:
        """The patch mail taking the current parent to `contents`."""
        message = f"{header.subject}\n\n{header.description}\n" if header.description else header.subject
        return self.format(self.commit(contents, message, header.author, header.date, modes), header.name, widen)

    def format(self, commit_id: str, name: str, widen: bool = True) -> str:
        with git_errors(f"formatting {name} in {self.cache.path}"):
            return self._format(commit_id, name, widen)

    def _format(self, commit_id: str, name: str, widen: bool) -> str:
        base = self.repo.git.rev_parse(f"{commit_id}^")
        contents = None
        for context in range(3, MAX_CONTEXT + 1 if widen else 4):
            text = self.repo.git.format_patch("-1", "--stdout", "--no-renames", "--no-signature",
                                              f"-U{context}", commit_id, strip_newline_in_stdout=False)
            patch = parse_patch(name, text.encode("utf-8"))
            if contents is None:
                contents = self.cache.read(base, list(patch.paths))
            analysis = analyze([patch], contents)
            if analysis.consistent and analysis.applied == 0 and \
                    analyze([patch], {**contents, **analysis.patched}).applied == 1:
                return text
        problems = "; ".join(p for r in analysis.reports for p in r.problems())
        if not widen:
            raise PatchFailed(f"{name}: {problems}; pass --unique to widen the context until every anchor is unique")
        raise PatchFailed(f"{name}: no context up to {MAX_CONTEXT} lines makes its anchors unique ({problems})")
