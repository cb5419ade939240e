"""The upstream cache writes where it is told: a cache given a path keeps its checked-out trees beside it, and
nothing lands in the user's cache (``$VLLM_PATCH_CACHE``)."""

from __future__ import annotations

from pathlib import Path

from helpers import git
from vllm_patch.lifecycle.upstream_trees import UpstreamCache


def test_a_cache_given_a_path_writes_its_trees_beside_it_and_nowhere_else(tmp_path: Path, monkeypatch):
    user_cache = tmp_path / "user-cache"
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(user_cache))
    repo = tmp_path / "vllm"
    (repo / "vllm").mkdir(parents=True)
    (repo / "vllm" / "a.py").write_text("x = 1\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "tag", "v0.33.0")
    cache = UpstreamCache(tmp_path / "given" / "upstream.git")
    tree = cache.from_git(str(repo), "v0.33.0")
    root = cache.checkout(tree.commit)
    assert root.is_relative_to(tmp_path / "given" / "trees")
    assert (root / "vllm" / "a.py").read_text() == "x = 1\n"
    assert not user_cache.exists() or not any(user_cache.rglob("*"))
