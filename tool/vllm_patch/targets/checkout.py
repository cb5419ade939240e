"""A vLLM git checkout: HEAD must be (or descend from) the pinned commit or tag.

With ``--commit`` the series becomes one commit per patch, built with git's
plumbing in a private index before any file of the work tree is written;
HEAD moves last, under the same journal as the files.
"""

from __future__ import annotations

import os
from email.utils import parseaddr
from pathlib import Path

import git

from ..engine.analysis import Analysis, Contents
from ..engine.patchfile import Patch
from ..engine.pin import Pin
from ..errors import PinMismatch, TargetError
from ..infrastructure.gitindex import private_index, stage
from ..infrastructure.transaction import Journal
from .base import Found, Goal, Plan, Target


class CheckoutTarget(Target):
    """A git work tree holding the vLLM sources."""

    kind = "checkout"

    def __init__(self, root: Path) -> None:
        try:
            self.repo = git.Repo(root)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise TargetError(f"{root} is not a git work tree") from None
        if self.repo.bare or self.repo.working_tree_dir is None:
            raise TargetError(f"{root} is a bare repository")
        self._git_accepts(root)
        super().__init__(Path(self.repo.working_tree_dir).resolve())

    def _git_accepts(self, root: Path) -> None:
        """GitPython reads refs by itself, so a repository git refuses (e.g. "dubious ownership",
        safe.directory) would only show up later as a missing commit: ask git once, up front."""
        try:
            self.repo.git.rev_parse("--git-dir")
        except git.GitCommandError as exc:
            raise TargetError(f"git refuses the checkout {root}: {_stderr(exc)}") from None

    @property
    def journal(self) -> Journal:
        return Journal(self.root, Path(self.repo.git_dir).resolve() / "vllm-patch-journal")

    def head(self) -> str:
        try:
            return self.repo.head.commit.hexsha
        except ValueError:
            raise TargetError(f"{self.root} has no commit yet") from None

    def found(self) -> Found:
        head = self.head()
        tags = [t.name for t in self.repo.tags if t.commit.hexsha == head]
        info = self._version_file()
        return Found(info.version or (tags[0] if tags else None), head,
                     f"HEAD {head[:12]}" + (f" (tag {', '.join(tags)})" if tags else ""))

    def base_commit(self, pin: Pin) -> str | None:
        """The pinned base in this repository: the pin's tag, else its commit id."""
        if pin.tag in [t.name for t in self.repo.tags]:
            return self.repo.tags[pin.tag].commit.hexsha
        try:
            return self.repo.commit(pin.commit).hexsha
        except (git.BadName, ValueError):
            return None

    def check_pin(self, pin: Pin) -> Found:
        """HEAD must be the pinned base, a release the pin declares (tag ``vX.Y.Z`` of an
        ``also`` release), or a descendant of one."""
        found = self.found()
        base = self.base_commit(pin)
        head = self.head()
        if base is None:
            raise PinMismatch(f"{self.root}: neither tag {pin.tag} nor commit {pin.commit[:9]} exists; "
                              f"HEAD is {head[:12]}; fetch the tag, rebase the series, or pass --force")
        tags = {t.name: t for t in self.repo.tags}
        bases = {pin.tag: base, **{f"v{r}": tags[f"v{r}"].commit.hexsha for r in pin.also if f"v{r}" in tags}}
        try:
            descends = any(b == head or self.repo.is_ancestor(b, head) for b in bases.values())
        except git.GitCommandError as exc:
            raise TargetError(f"git could not compare HEAD with {pin.tag} in {self.root}: {_stderr(exc)}") from None
        if not descends:
            also = f" (nor {', '.join(list(bases)[1:])})" if len(bases) > 1 else ""
            raise PinMismatch(f"{self.root}: HEAD {head[:12]} is not {pin.tag} ({base[:12]}){also} nor "
                              "a descendant of it; check out the tag, rebase the series, or pass --force")
        return found

    def dirty(self, paths: list[str]) -> list[str]:
        """Touched paths whose work-tree or index state differs from HEAD."""
        try:
            status = self.repo.git.status("--porcelain", "--untracked-files=all", "--", *paths)
        except git.GitCommandError as exc:
            raise TargetError(f"git status failed in {self.root}: {_stderr(exc)}") from None
        return [line[3:] for line in status.splitlines() if line.strip()]

    def committed(self, rel: str) -> bytes | None:
        """The file as HEAD has it (None when HEAD has no such file)."""
        try:
            return (self.repo.head.commit.tree / rel).data_stream.read()
        except KeyError:
            return None

    def verify_before_write(self, paths: list[str], contents: Contents, analysis: Analysis) -> None:
        """Touched files must be clean, unless their only uncommitted changes are the
        series itself (applied earlier without --commit)."""
        dirty = self.dirty(paths)
        if dirty and analysis.consistent and all(self.committed(p) == analysis.base.get(p) for p in dirty):
            return
        if dirty:
            names = ", ".join(dirty[:5])
            raise TargetError(f"{self.root}: files the series touches have uncommitted changes "
                              f"({names}); commit or stash them first")

    def plan_commits(self, plan: Plan, goal: Goal) -> None:
        if not plan.changes:
            return
        if self.dirty(list(goal.new)):
            raise TargetError(f"{self.root}: the series is applied in the work tree but not committed; "
                              "run without --commit, or commit those changes first")
        plan.extra = {"old_head": self.head(), "paths": list(plan.changes)}
        plan.commits = goal

    def commit(self, plan: Plan) -> None:
        if plan.commits is not None:
            plan.extra["new_head"] = self._build_commits(plan.commits)
        super().commit(plan)

    def _build_commits(self, goal: Goal) -> str:
        """One commit per patch applied (or reverted), in a private index: the work tree
        and the real index are not touched here."""
        analysis, patches, keep = goal.analysis, goal.patches, goal.keep
        head = self.head()
        if keep >= analysis.applied:
            steps = [(patches[i], analysis.stage(i), "") for i in range(analysis.applied, keep)]
        else:
            steps = [(patches[i], analysis.stage(i - 1) if i else analysis.base, "Revert \"")
                     for i in range(analysis.applied - 1, keep - 1, -1)]
        try:
            with private_index(self.repo.git_dir) as env:
                self.repo.git.read_tree(head, env=env)
                parent = head
                for patch, contents, revert in steps:
                    stage(self.repo.git, env, {rel: contents.get(rel) for rel in patch.paths},
                          lambda rel, patch=patch: self._mode(rel, patch))
                    tree = self.repo.git.write_tree(env=env)
                    message = f"{revert}{patch.subject}\"" if revert else f"{patch.subject}\n\n{patch.description}"
                    parent = self.repo.git.commit_tree(tree, "-p", parent, "-m", message,
                                                       env=_author_env(patch) if not revert else {})
                return parent
        except git.GitCommandError as exc:
            raise TargetError(f"git failed while building the commits: {_stderr(exc)}") from None

    def _mode(self, rel: str, patch: Patch) -> int:
        """A file's mode in the commit: the patch's for a file it creates or deletes, else the work tree's."""
        for fd in patch.files:
            if fd.path == rel and fd.kind != "modify":
                return fd.mode
        path = self.root / rel
        return path.stat().st_mode if path.exists() else 0o644

    def finish(self, extra: dict) -> None:
        """Point the index entries of the touched paths, then HEAD, at the new commit."""
        if not extra.get("new_head"):
            return
        try:
            self.repo.git.reset("-q", extra["new_head"], "--", *extra["paths"])
            self.repo.git.update_ref("HEAD", extra["new_head"], extra["old_head"])
        except git.GitCommandError as exc:
            raise TargetError(f"git could not move HEAD in {self.root}: {_stderr(exc)}; "
                              "nothing was changed") from None

    def undo(self, extra: dict) -> None:
        """Put HEAD and the touched index entries back where they were."""
        if not extra.get("new_head"):
            return
        try:
            if self.head() == extra["new_head"]:
                self.repo.git.update_ref("HEAD", extra["old_head"], extra["new_head"])
            self.repo.git.reset("-q", extra["old_head"], "--", *extra["paths"])
        except git.GitCommandError as exc:
            raise TargetError(f"git could not restore HEAD {extra['old_head'][:12]} in {self.root}: "
                              f"{_stderr(exc)}; run 'git reset {extra['old_head'][:12]}' by hand") from None


def _stderr(exc: git.GitCommandError) -> str:
    text = exc.stderr if isinstance(exc.stderr, str) else str(exc)
    return " ".join(text.replace("stderr:", "").split()).strip("' ")


def _author_env(patch: Patch) -> dict[str, str]:
    name, email = parseaddr(patch.author)
    env = {}
    if name or email:
        env.update(GIT_AUTHOR_NAME=name or email, GIT_AUTHOR_EMAIL=email)
        env.setdefault("GIT_COMMITTER_NAME", os.environ.get("GIT_COMMITTER_NAME", name or email))
        env.setdefault("GIT_COMMITTER_EMAIL", os.environ.get("GIT_COMMITTER_EMAIL", email))
    if patch.date:
        env["GIT_AUTHOR_DATE"] = patch.date
    return env
