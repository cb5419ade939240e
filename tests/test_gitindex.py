"""Commits built in a private index: blobs, modes and deletions, with the real index untouched."""

from __future__ import annotations

from pathlib import Path

import git

from vllm_patch.infrastructure.gitindex import git_mode, private_index, stage


def test_git_mode_keeps_only_the_executable_bit():
    assert git_mode(0o100644) == "100644"
    assert git_mode(0o100755) == "100755"
    assert git_mode(0o100700) == "100755"
    assert git_mode(0o100600) == "100644"


def _tree(g: git.Git, env: dict[str, str]) -> dict[str, tuple[str, bytes]]:
    tree = g.write_tree(env=env)
    out = {}
    for line in g.ls_tree("-r", tree).splitlines():
        meta, path = line.split("\t")
        mode, _, blob = meta.split()
        out[path] = (mode, g.cat_file("blob", blob, stdout_as_string=False, strip_newline_in_stdout=False))
    return out


def test_stage_writes_blobs_modes_and_removals_in_a_private_index(tmp_path):
    repo = git.Repo.init(tmp_path / "cache.git", bare=True)
    g = repo.git
    modes = {"bin/run.sh": 0o755}
    with private_index(repo.git_dir) as env:
        index = Path(env["GIT_INDEX_FILE"])
        assert index.parent == Path(repo.git_dir) and not index.exists()
        stage(g, env, {"vllm/a.py": b"a = 1\n", "bin/run.sh": b"#!/bin/sh\n", "vllm/gone.py": b"x\n"},
              lambda rel: modes.get(rel, 0o644))
        assert _tree(g, env) == {"bin/run.sh": ("100755", b"#!/bin/sh\n"), "vllm/a.py": ("100644", b"a = 1\n"),
                                 "vllm/gone.py": ("100644", b"x\n")}
        stage(g, env, {"vllm/gone.py": None, "vllm/a.py": b"a = 2\n"}, lambda rel: 0o644)
        assert _tree(g, env) == {"bin/run.sh": ("100755", b"#!/bin/sh\n"), "vllm/a.py": ("100644", b"a = 2\n")}
        stage(g, env, {}, lambda rel: 0o644)  # nothing to stage: the index is left as it is
        assert set(_tree(g, env)) == {"bin/run.sh", "vllm/a.py"}
    assert not index.exists()
    assert not (Path(repo.git_dir) / "index").exists()
