from __future__ import annotations

import os

import pytest

from helpers import git, git_repo, snapshot
from vllm_patch import operations
from vllm_patch.errors import PinMismatch, TargetError
from vllm_patch.series import load_series
from vllm_patch.targets import open_target
from vllm_patch.targets.checkout import CheckoutTarget


@pytest.fixture
def checkout(tmp_path, base_files):
    files = {k: v for k, v in base_files.items() if k != "vllm/_version.py"}
    return git_repo(tmp_path / "checkout", files, tag="v0.20.0")


def log(root):
    return git(root, "log", "--format=%s|%an").decode().splitlines()


def test_apply_with_commit_makes_one_commit_per_patch(checkout, two_patch_series):
    series = load_series(two_patch_series)
    assert isinstance(open_target(str(checkout)), CheckoutTarget)
    out = operations.apply(CheckoutTarget(checkout), series, commit_each=True)
    assert out.ok
    assert log(checkout)[:2] == ["second fix|Test Author", "first fix|Test Author"]
    assert git(checkout, "status", "--porcelain") == b""
    assert operations.status(CheckoutTarget(checkout), series).verdict == "applied"
    operations.revert(CheckoutTarget(checkout), series, commit_each=True)
    assert log(checkout)[0].startswith('Revert "first fix"')
    assert git(checkout, "diff", "v0.20.0", "HEAD") == b""
    assert git(checkout, "status", "--porcelain") == b""


def test_apply_without_commit_leaves_changes_in_the_work_tree(checkout, two_patch_series):
    before = snapshot(checkout)
    operations.apply(CheckoutTarget(checkout), load_series(two_patch_series))
    assert git(checkout, "rev-parse", "HEAD") == git(checkout, "rev-parse", "v0.20.0")
    assert b"vllm/a.py" in git(checkout, "status", "--porcelain")
    operations.revert(CheckoutTarget(checkout), load_series(two_patch_series))
    assert snapshot(checkout) == before


def test_dirty_touched_file_is_refused(checkout, two_patch_series):
    (checkout / "vllm/b.py").write_bytes(b"def f():\n    return 1\n\n\ndef g():\n    return 2\n# wip\n")
    before = snapshot(checkout)
    with pytest.raises(TargetError, match="uncommitted changes"):
        operations.apply(CheckoutTarget(checkout), load_series(two_patch_series))
    assert snapshot(checkout) == before


def test_head_elsewhere_is_a_pin_mismatch(checkout, two_patch_series):
    git(checkout, "tag", "-d", "v0.20.0")
    with pytest.raises(PinMismatch, match="neither tag v0.20.0 nor commit"):
        operations.apply(CheckoutTarget(checkout), load_series(two_patch_series))
    git(checkout, "tag", "v0.20.0")
    git(checkout, "checkout", "-q", "--orphan", "other")
    git(checkout, "commit", "-q", "-m", "unrelated")
    with pytest.raises(PinMismatch, match="not v0.20.0"):
        operations.apply(CheckoutTarget(checkout), load_series(two_patch_series))


def test_killed_commit_run_rolls_back_files_and_head(checkout, two_patch_series):
    import os
    import subprocess
    import sys
    head = git(checkout, "rev-parse", "HEAD")
    before = snapshot(checkout)
    script = ("import sys; from pathlib import Path; from vllm_patch import operations; "
              "from vllm_patch.series import load_series; from vllm_patch.targets.checkout import CheckoutTarget; "
              "operations.apply(CheckoutTarget(Path(sys.argv[1])), load_series(Path(sys.argv[2])), "
              "commit_each=True)")
    proc = subprocess.run([sys.executable, "-c", script, str(checkout), str(two_patch_series)],
                          env={**os.environ, "VLLM_PATCH_FAULT_AFTER_WRITES": "2"})
    assert proc.returncode == -9
    out = operations.status(CheckoutTarget(checkout), load_series(two_patch_series))
    assert "rolled back" in out.recovered
    assert snapshot(checkout) == before and git(checkout, "rev-parse", "HEAD") == head


def test_held_index_lock_leaves_head_and_files_alone(checkout, two_patch_series):
    head = git(checkout, "rev-parse", "HEAD")
    before = snapshot(checkout)
    (checkout / ".git/index.lock").write_bytes(b"")
    try:
        with pytest.raises(TargetError):
            operations.apply(CheckoutTarget(checkout), load_series(two_patch_series), commit_each=True)
    finally:
        (checkout / ".git/index.lock").unlink()
    assert git(checkout, "rev-parse", "HEAD") == head and snapshot(checkout) == before
    assert not (checkout / ".git/vllm-patch-journal").exists()


def test_commit_refused_when_the_series_sits_uncommitted(checkout, two_patch_series):
    series = load_series(two_patch_series)
    operations.apply(CheckoutTarget(checkout), series)
    with pytest.raises(TargetError, match="applied in the work tree but not committed"):
        operations.revert(CheckoutTarget(checkout), series, commit_each=True)
    operations.revert(CheckoutTarget(checkout), series)
    assert git(checkout, "status", "--porcelain") == b""


def test_dry_run_with_commit_writes_no_git_object(checkout, two_patch_series):
    objects = git(checkout, "count-objects", "-v")
    operations.apply(CheckoutTarget(checkout), load_series(two_patch_series), commit_each=True, dry_run=True)
    assert git(checkout, "count-objects", "-v") == objects


def test_force_overrides_a_pin_mismatch_but_not_a_git_failure(checkout, two_patch_series, monkeypatch):
    """--force goes on past a pin mismatch only: git failing while it compares HEAD with the pinned
    tag (a repository it cannot read; simulated, as git reports most damage as "not an ancestor")
    stops the run with the target unchanged."""
    import git as gitpython

    series = load_series(two_patch_series)
    git(checkout, "commit", "-q", "--allow-empty", "-m", "on top of the tag")

    def unreadable(self, ancestor, rev):
        raise gitpython.GitCommandError(["git", "merge-base", "--is-ancestor"], 128, b"fatal: bad object")

    before = snapshot(checkout)
    with monkeypatch.context() as m:
        m.setattr(gitpython.Repo, "is_ancestor", unreadable)
        with pytest.raises(TargetError, match="git could not compare HEAD with v0.20.0.*bad object"):
            operations.apply(CheckoutTarget(checkout), series, force=True)
    assert snapshot(checkout) == before
    git(checkout, "tag", "-d", "v0.20.0")  # now a pin mismatch, which --force overrides
    out = operations.apply(CheckoutTarget(checkout), series, force=True)
    assert out.ok and any(n.startswith("--force: ") and "neither tag v0.20.0" in n for n in out.notes)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another uid needs root")
def test_checkout_git_refuses_is_reported_with_gits_reason(tmp_path, checkout, two_patch_series, monkeypatch):
    """A checkout owned by another user, which git refuses ("dubious ownership", safe.directory),
    is reported with git's own reason, not as a checkout with no commit."""
    empty = tmp_path / "empty-gitconfig"
    empty.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))  # no safe.directory of the user's may mask it
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for path in [checkout, *checkout.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)  # nobody
    before = snapshot(checkout)
    with pytest.raises(TargetError) as caught:
        operations.status(open_target(str(checkout)), load_series(two_patch_series))
    assert "dubious ownership" in caught.value.message and "safe.directory" in caught.value.message
    assert "no commit" not in caught.value.message and "\n" not in caught.value.message
    with pytest.raises(TargetError, match="dubious ownership"):
        operations.apply(open_target(str(checkout)), load_series(two_patch_series))
    assert snapshot(checkout) == before


def test_a_checkout_of_a_release_the_pin_declares_passes_the_pin_check(checkout, two_patch_series):
    """A series declaring ``#: also = 0.20.1`` applies to a checkout of v0.20.1 (not a descendant of
    v0.20.0: releases come from their own branches) without --force; other releases still fail."""
    series_file = two_patch_series / "series"
    git(checkout, "checkout", "-q", "--orphan", "releases/v0.20.1")
    git(checkout, "commit", "-q", "-m", "v0.20.1 on its own branch")
    git(checkout, "tag", "v0.20.1")
    with pytest.raises(PinMismatch, match="is not v0.20.0"):
        operations.apply(CheckoutTarget(checkout), load_series(two_patch_series), dry_run=True)
    series_file.write_text(series_file.read_text().replace("#: wheel", "#: also = 0.20.1\n#: wheel", 1))
    assert operations.apply(CheckoutTarget(checkout), load_series(two_patch_series), dry_run=True).ok
    git(checkout, "tag", "-d", "v0.20.1")
    git(checkout, "tag", "v0.20.2")
    with pytest.raises(PinMismatch, match="is not v0.20.0"):
        operations.apply(CheckoutTarget(checkout), load_series(two_patch_series), dry_run=True)
