from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import PIN_LINES, git, git_repo, snapshot, write_tree
from vllm_patch import operations
from vllm_patch.errors import PatchFailed, PinMismatch
from vllm_patch.series import load_series
from vllm_patch.targets import TreeTarget


def test_round_trip_is_byte_exact(tree, two_patch_series):
    series = load_series(two_patch_series)
    before = snapshot(tree)
    out = operations.apply(TreeTarget(tree), series)
    assert out.ok and out.changed == ["vllm/a.py", "vllm/b.py", "vllm/new_kernel.py"]
    assert operations.status(TreeTarget(tree), series).verdict == "applied"
    again = operations.apply(TreeTarget(tree), series)
    assert again.changed == [] and again.verdict == "applied"
    operations.revert(TreeTarget(tree), series)
    assert snapshot(tree) == before


def test_dry_run_writes_nothing(tree, two_patch_series):
    before = snapshot(tree)
    out = operations.apply(TreeTarget(tree), load_series(two_patch_series), dry_run=True)
    assert out.changed and snapshot(tree) == before


def test_conflict_changes_nothing(tree, two_patch_series):
    (tree / "vllm/b.py").write_bytes(b"def f():\n    return 7\n")
    before = snapshot(tree)
    with pytest.raises(PatchFailed) as info:
        operations.apply(TreeTarget(tree), load_series(two_patch_series))
    assert "0001-first-fix.patch is conflict" in info.value.message
    assert snapshot(tree) == before


def test_version_mismatch_refused_unless_forced(tree, two_patch_series):
    (tree / "vllm/_version.py").write_bytes(b"__version__ = '0.21.0'\n__commit_id__ = 'g1234567ab'\n")
    before = snapshot(tree)
    with pytest.raises(PinMismatch, match="0.21.0.*pinned to 0.20.0.*rebase"):
        operations.apply(TreeTarget(tree), load_series(two_patch_series))
    assert snapshot(tree) == before
    out = operations.apply(TreeTarget(tree), load_series(two_patch_series), force=True)
    assert out.ok and any("--force" in n for n in out.notes)


def test_commit_mismatch_refused(tree, two_patch_series):
    (tree / "vllm/_version.py").write_bytes(b"__version__ = '0.20.0'\n__commit_id__ = 'gdeadbeef1'\n")
    with pytest.raises(PinMismatch, match="commit gdeadbeef1"):
        operations.apply(TreeTarget(tree), load_series(two_patch_series))


def test_tree_without_version_file_is_refused(tree, two_patch_series):
    (tree / "vllm/_version.py").unlink()
    with pytest.raises(PinMismatch, match="cannot tell"):
        operations.apply(TreeTarget(tree), load_series(two_patch_series))


def test_interrupted_apply_is_recovered_by_next_command(tree, two_patch_series, monkeypatch):
    import subprocess
    import sys
    before = snapshot(tree)
    script = ("import sys; from pathlib import Path; from vllm_patch import operations; "
              "from vllm_patch.series import load_series; from vllm_patch.targets import TreeTarget; "
              "operations.apply(TreeTarget(Path(sys.argv[1])), load_series(Path(sys.argv[2])))")
    proc = subprocess.run([sys.executable, "-c", script, str(tree), str(two_patch_series)],
                          env={**__import__("os").environ, "VLLM_PATCH_FAULT_AFTER_WRITES": "2"})
    assert proc.returncode == -9
    assert snapshot(tree) != before
    out = operations.status(TreeTarget(tree), load_series(two_patch_series))
    assert out.recovered and "rolled back" in out.recovered
    assert snapshot(tree) == before and out.verdict == "applies"


def test_modes_of_created_and_restored_files(tmp_path, base_files):
    base = {**base_files, "vllm/tool.sh": b"#!/bin/sh\necho old\n"}
    work = git_repo(tmp_path / "work", base)
    os.chmod(work / "vllm/tool.sh", 0o755)
    git(work, "commit", "-q", "-am", "tool.sh is executable")
    write_tree(work, {"vllm/new.sh": b"#!/bin/sh\necho new\n", "vllm/tool.sh": None})
    os.chmod(work / "vllm/new.sh", 0o755)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "add one script, drop another\n\nOrigin: vendor\n")
    series_dir = tmp_path / "s"
    out = git(work, "format-patch", "--no-renames", "-o", str(series_dir / "patches"), "HEAD~1")
    (series_dir / "series").write_text(PIN_LINES + Path(out.decode().strip()).name + "\n")
    root = tmp_path / "t"
    write_tree(root, base)
    os.chmod(root / "vllm/tool.sh", 0o755)
    series = load_series(series_dir)
    operations.apply(TreeTarget(root), series)
    assert (root / "vllm/new.sh").stat().st_mode & 0o777 == 0o755
    assert not (root / "vllm/tool.sh").exists()
    operations.revert(TreeTarget(root), series)
    assert (root / "vllm/tool.sh").stat().st_mode & 0o777 == 0o755
