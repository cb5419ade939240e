"""Upstream vLLM trees as commits of one cache repository, whatever their source.

A tree comes from a local git checkout (any ref), a git URL, or the PyPI sdist of
a release (sha256 from the index, checked). An sdist becomes a commit with fixed
metadata, so the same tree is always the same commit and git's machinery
(merge-file, diff, format-patch) works on it. Trees are cached per commit.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import git
from packaging.version import InvalidVersion, Version

from ..engine.analysis import Contents
from ..engine.versionfile import parse_version_file
from ..errors import DownloadError, InputError, UpstreamError
from ..infrastructure.downloads import cache_root, fetch, indexed_artifact, unpack_sdist
from ..infrastructure.gitindex import private_index

FIXED = {"GIT_AUTHOR_NAME": "vllm-patch", "GIT_AUTHOR_EMAIL": "vllm-patch@localhost",
         "GIT_COMMITTER_NAME": "vllm-patch", "GIT_COMMITTER_EMAIL": "vllm-patch@localhost",
         "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


# Rename detection: git's default similarity first; a lower one only for files whose
# name still holds the old file's stem (0.22 split mamba/gdn_linear_attn.py into
# mamba/gdn/qwen_gdn_linear_attn.py and two siblings: 54 % similar then, 35 % by 0.33).
RENAME_SIMILARITY = 50
RENAME_SIMILARITY_SAME_STEM = 30


def _one_line(exc: subprocess.CalledProcessError) -> str:
    stderr = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
    return (" ".join(stderr.split()) or f"exit status {exc.returncode}")[:300]


@dataclass
class Moves:
    """What happened between two trees to the files a series touches: `moved` maps an
    old path to the path git's rename detection finds for it, `gone` lists the ones
    deleted with no such path."""

    moved: dict[str, str] = field(default_factory=dict)
    similarity: dict[str, int] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)

    def path(self, rel: str) -> str:
        return self.moved.get(rel, rel)

    def describe(self, rel: str) -> str:
        if rel in self.moved:
            return f"{rel} -> {self.moved[rel]} ({self.similarity.get(rel, 0)}% similar)"
        return f"{rel} (deleted upstream)" if rel in self.gone else rel

    def as_dict(self) -> dict:
        return {"moved": dict(self.moved), "similarity": dict(self.similarity), "gone": list(self.gone)}

    @classmethod
    def from_dict(cls, data: dict | None) -> Moves:
        data = data or {}
        return cls(dict(data.get("moved", {})), dict(data.get("similarity", {})), list(data.get("gone", [])))


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
    """The bare cache repository (``<cache>/upstream.git``) and, beside it, the trees it unpacks or checks out
    (``<cache>/trees``): a cache given a path of its own writes nothing anywhere else."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_root() / "upstream.git"
        self.trees = self.path.parent / "trees"
        self._exists: dict[tuple[str, str], bool] = {}
        try:
            if (self.path / "HEAD").is_file():
                self.repo = git.Repo(self.path)
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                self.repo = git.Repo.init(self.path, bare=True)
        except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError, git.GitCommandError, OSError) as exc:
            raise UpstreamError(f"the cache repository {self.path} is unusable ({type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:200]}); remove it and run again") from None

    def git(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None) -> bytes:
        """Run git on the cache repository; a failure is one line, not a traceback."""
        try:
            return subprocess.run(["git", "--git-dir", str(self.path), *args], input=input, capture_output=True,
                                  check=True, env={**os.environ, **(env or {})}).stdout
        except subprocess.CalledProcessError as exc:
            verb = next((a for a in args if not a.startswith("-") and "/" not in a), args[0])
            raise UpstreamError(f"git {verb} failed on {self.path}: {_one_line(exc)}") from None
        except OSError as exc:
            raise UpstreamError(f"cannot run git: {exc}") from None

    def _ref(self, name: str) -> str | None:
        try:
            return self.repo.git.rev_parse("--verify", "-q", f"{name}^{{commit}}")
        except git.GitCommandError:
            return None

    def cached_sdists(self) -> list[str]:
        """The release versions whose sdist is already a commit of the cache repository."""
        out = self.git("for-each-ref", "--format=%(refname)", "refs/tags/sdist/").decode()
        return [line.removeprefix("refs/tags/sdist/v") for line in out.split()]

    def from_sdist(self, tag: str, quiet: bool = False) -> UpstreamTree:
        """The release's PyPI sdist as a commit (downloaded and imported once)."""
        version = version_of_tag(tag)
        ref = f"refs/tags/sdist/v{version}"
        commit = self._ref(ref)
        if commit is None:
            artifact = indexed_artifact("vllm", f"vllm-{version}.tar.gz")
            tree = unpack_sdist(fetch(artifact, quiet=quiet), artifact.sha256, self.trees)
            commit = self._import_dir(tree, f"vLLM {version} from the PyPI sdist (sha256 {artifact.sha256})")
            self.git("update-ref", ref, commit)
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
        with private_index(self.path) as index:
            env = {**FIXED, **index, "GIT_WORK_TREE": str(tree)}
            self.git("add", "-A", "-f", ".", env=env)
            tree_id = self.git("write-tree", env=env).decode().strip()
            return self.git("commit-tree", tree_id, "-m", message, env=env).decode().strip()

    def describe(self, commit: str, source: str) -> UpstreamTree:
        """The version and upstream commit `vllm/_version.py` names at `commit`."""
        info = self.read(commit, ["vllm/_version.py"])["vllm/_version.py"]
        parsed = parse_version_file(info.decode("utf-8", "replace")) if info else None
        return UpstreamTree(commit, parsed.version if parsed else None, parsed.commit if parsed else None, source)

    def read(self, commit: str, paths: list[str]) -> Contents:
        """Files at `commit` (None for absent ones)."""
        try:
            tree = self.repo.commit(commit).tree
        except (ValueError, git.exc.BadName, git.GitCommandError) as exc:
            raise UpstreamError(f"commit {commit} is not in the cache repository {self.path} ({exc}); "
                                "run rebase --abort and start again") from None
        out: Contents = {}
        for rel in paths:
            try:
                out[rel] = (tree / rel).data_stream.read()
            except KeyError:
                out[rel] = None
        return out

    def exists(self, commit: str, paths: list[str]) -> dict[str, bool]:
        """Whether each path is a file at `commit` (one ls-tree for those not asked before)."""
        ask = [p for p in dict.fromkeys(paths) if (commit, p) not in self._exists]
        if ask:
            found = {line.split(b"\t", 1)[1].decode() for line in
                     self.git("ls-tree", "-z", commit, "--", *ask).split(b"\0") if b"\t" in line}
            for p in ask:
                self._exists[(commit, p)] = p in found
        return {p: self._exists[(commit, p)] for p in paths}

    def _tree_of(self, entries: list[tuple[str, str, str]]) -> str:
        """A tree object holding exactly `entries` (mode, blob id, path)."""
        with private_index(self.path) as env:
            self.git("update-index", "-z", "--index-info", env=env,
                     input=b"".join(f"{m} {b}\t{p}".encode() + b"\0" for m, b, p in entries))
            return self.git("write-tree", env=env).decode().strip()

    def _renames(self, old: list[tuple[str, str, str]], new: list[tuple[str, str, str]],
                 similarity: int) -> dict[str, tuple[str, int]]:
        if not old or not new:
            return {}
        raw = self.git("diff-tree", "-r", "-z", f"-M{similarity}%", "-l0", "--diff-filter=R",
                       self._tree_of(old), self._tree_of(new)).split(b"\0")
        out = {}
        for i in range(0, len(raw) - 2, 3):
            status = raw[i].split()[-1].decode()
            out[raw[i + 1].decode()] = (raw[i + 2].decode(), int(status[1:] or 0))
        return out

    def renames(self, old: str, new: str, paths: list[str]) -> Moves:
        """Where the files `paths` (at commit `old`) went by commit `new`: git's rename detection
        between the two trees, run on the touched files that `new` lacks against the files `new`
        added (same extension) - the whole-tree detection would give up on vLLM's thousands of
        added files. A match below git's default similarity is taken only when the new file's
        name holds the old one's stem."""
        at_old = self.exists(old, paths)
        at_new = self.exists(new, paths)
        lost = [p for p in paths if at_old[p] and not at_new[p]]
        moves = Moves()
        if not lost:
            return moves
        blobs = []
        for line in self.git("ls-tree", "-z", old, "--", *lost).split(b"\0"):
            if b"\t" in line:
                meta, path = line.split(b"\t", 1)
                mode, _, blob = meta.decode().split()
                blobs.append((mode, blob, path.decode()))
        added = []
        raw = self.git("diff-tree", "-r", "-z", "--no-renames", "--diff-filter=A", old, new).split(b"\0")
        for i in range(0, len(raw) - 1, 2):
            meta = raw[i].decode().split()
            if len(meta) >= 4:
                added.append((meta[1], meta[3], raw[i + 1].decode()))
        remaining = blobs
        for similarity, same_stem in ((RENAME_SIMILARITY, False), (RENAME_SIMILARITY_SAME_STEM, True)):
            if not remaining:
                break
            found: dict[str, tuple[str, int]] = {}
            for ext in {PurePosixPath(p).suffix for _, _, p in remaining}:
                olds = [e for e in remaining if PurePosixPath(e[2]).suffix == ext]
                stems = [PurePosixPath(p).stem for _, _, p in olds]
                cands = [e for e in added if PurePosixPath(e[2]).suffix == ext
                         and (not same_stem or any(s in PurePosixPath(e[2]).name for s in stems))]
                found.update(self._renames(olds, cands, similarity))
            for src, (dst, score) in found.items():
                moves.moved[src], moves.similarity[src] = dst, score
            remaining = [e for e in remaining if e[2] not in found]
        moves.gone = [p for p in lost if p not in moves.moved]
        return moves

    def checkout(self, commit: str) -> Path:
        """A directory holding the files of `commit` (written once, cached)."""
        dest = self.trees / f"commit-{commit[:20]}"
        if (dest / ".complete").is_file():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".checkout-", dir=dest.parent))
        try:
            with private_index(self.path) as env:
                self.git("read-tree", commit, env=env)
                self.git("--work-tree", str(tmp), "checkout-index", "-a", "-f", env=env)
            (tmp / ".complete").write_text("ok\n")
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest


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
