"""Upstream vLLM trees as commits of one cache repository, whatever their source.

A tree comes from a local git checkout (any ref), a git URL, or the PyPI sdist of
a release (sha256 from the index, checked). An sdist becomes a commit with fixed
metadata, so the same tree is always the same commit and git's machinery
(merge-file, diff, format-patch) works on it. Trees are cached per commit.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git
from packaging.version import InvalidVersion, Version

from .engine import Contents
from .errors import DownloadError, InputError
from .upstream import cache_root, fetch, indexed_artifact, unpack_sdist
from .versionfile import parse_version_file

FIXED = {"GIT_AUTHOR_NAME": "vllm-patch", "GIT_AUTHOR_EMAIL": "vllm-patch@localhost",
         "GIT_COMMITTER_NAME": "vllm-patch", "GIT_COMMITTER_EMAIL": "vllm-patch@localhost",
         "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


@dataclass(frozen=True)
class UpstreamTree:
    """A vLLM source tree: its commit in the cache repository and what it says it is."""

    commit: str
    version: str | None
    upstream_commit: str | None
    source: str


def version_of_tag(tag: str) -> str:
    """``v0.21.0`` -> ``0.21.0``; refuses what is not a release version."""
    try:
        return str(Version(tag.removeprefix("v")))
    except InvalidVersion:
        raise InputError(f"unknown tag {tag!r}: expected a vLLM release such as v0.21.0") from None


class UpstreamCache:
    """The bare cache repository (``<cache>/upstream.git``)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_root() / "upstream.git"
        if (self.path / "HEAD").is_file():
            self.repo = git.Repo(self.path)
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self.repo = git.Repo.init(self.path, bare=True)

    def _ref(self, name: str) -> str | None:
        try:
            return self.repo.git.rev_parse("--verify", "-q", f"{name}^{{commit}}")
        except git.GitCommandError:
            return None

    def from_sdist(self, tag: str, quiet: bool = False) -> UpstreamTree:
        """The release's PyPI sdist as a commit (downloaded and imported once)."""
        version = version_of_tag(tag)
        ref = f"refs/tags/sdist/v{version}"
        commit = self._ref(ref)
        if commit is None:
            artifact = indexed_artifact("vllm", f"vllm-{version}.tar.gz")
            tree = unpack_sdist(fetch(artifact, quiet=quiet), artifact.sha256, cache_root() / "trees")
            commit = self._import_dir(tree, f"vLLM {version} from the PyPI sdist (sha256 {artifact.sha256})")
            self.repo.git.update_ref(ref, commit)
        return self.describe(commit, f"PyPI sdist vllm-{version}.tar.gz")

    def from_git(self, source: str, ref: str) -> UpstreamTree:
        """`ref` from a local checkout or a git URL, fetched into the cache repository."""
        key = hashlib.sha1(f"{source} {ref}".encode()).hexdigest()
        local = f"refs/vllm-patch/fetched/{key}"
        try:
            self.repo.git.fetch("--quiet", "--no-tags", source, f"+{ref}:{local}")
        except git.GitCommandError as exc:
            stderr = " ".join(str(exc.stderr).split())
            raise InputError(f"cannot fetch {ref!r} from {source}: {stderr}") from None
        commit = self._ref(local) or ""
        tree = self.describe(commit, f"{source} {ref}")
        # From git, the upstream commit is the fetched commit itself.
        return UpstreamTree(commit, tree.version, commit, tree.source)

    def _import_dir(self, tree: Path, message: str) -> str:
        fd, index = tempfile.mkstemp(prefix="index-", dir=self.path)
        os.close(fd)
        os.unlink(index)
        env = {**FIXED, "GIT_INDEX_FILE": index, "GIT_WORK_TREE": str(tree)}
        try:
            self.repo.git.add("-A", "-f", ".", env=env)
            tree_id = self.repo.git.write_tree(env=env)
            return self.repo.git.commit_tree(tree_id, "-m", message, env=env)
        finally:
            Path(index).unlink(missing_ok=True)

    def describe(self, commit: str, source: str) -> UpstreamTree:
        info = self.read(commit, ["vllm/_version.py"])["vllm/_version.py"]
        parsed = parse_version_file(info.decode("utf-8", "replace")) if info else None
        return UpstreamTree(commit, parsed.version if parsed else None, parsed.commit if parsed else None, source)

    def read(self, commit: str, paths: list[str]) -> Contents:
        """Files at `commit` (None for absent ones)."""
        tree = self.repo.commit(commit).tree
        out: Contents = {}
        for rel in paths:
            try:
                out[rel] = (tree / rel).data_stream.read()
            except KeyError:
                out[rel] = None
        return out


def get_tree(tag: str, repo: str | None = None, quiet: bool = False,
             cache: UpstreamCache | None = None) -> UpstreamTree:
    """The tree for `tag`: from `repo` (a checkout path or git URL; any ref) when given, else the PyPI sdist."""
    cache = cache or UpstreamCache()
    if repo:
        return cache.from_git(repo, tag)
    try:
        return cache.from_sdist(tag, quiet=quiet)
    except DownloadError as exc:
        raise InputError(f"cannot get vLLM {tag}: {exc.message}") from None
