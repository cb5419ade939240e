from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_patch.errors import TargetError
from vllm_patch.transaction import Journal, commit, read_files, recover


def journal(root: Path) -> Journal:
    return Journal(root, root / ".journal")


def test_commit_writes_creates_and_deletes(tmp_path):
    (tmp_path / "a").write_bytes(b"old")
    (tmp_path / "gone").write_bytes(b"x")
    commit(journal(tmp_path), {"a": b"new", "d/e/new": b"n", "gone": None})
    assert (tmp_path / "a").read_bytes() == b"new"
    assert (tmp_path / "d/e/new").read_bytes() == b"n"
    assert not (tmp_path / "gone").exists()
    assert not (tmp_path / ".journal").exists()


def test_commit_keeps_file_modes(tmp_path):
    (tmp_path / "x.sh").write_bytes(b"old")
    os.chmod(tmp_path / "x.sh", 0o755)
    commit(journal(tmp_path), {"x.sh": b"new", "y.sh": b"n"}, modes={"y.sh": 0o755})
    assert (tmp_path / "x.sh").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "y.sh").stat().st_mode & 0o777 == 0o755


def test_exception_mid_write_rolls_back(tmp_path):
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")

    def boom(extra):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        commit(journal(tmp_path), {"a": b"A2", "b": b"B2", "c": b"C"}, extra={"x": 1}, finish=boom)
    assert (tmp_path / "a").read_bytes() == b"A" and (tmp_path / "b").read_bytes() == b"B"
    assert not (tmp_path / "c").exists() and not (tmp_path / ".journal").exists()


KILL_SCRIPT = """
import sys
from pathlib import Path
from vllm_patch.transaction import Journal, commit
root = Path(sys.argv[1])
commit(Journal(root, root / ".journal"), {"a": b"A2", "b": b"B2", "c": b"C2"})
"""


def test_sigkill_between_two_writes_is_rolled_back_by_the_next_run(tmp_path):
    for name in "abc":
        (tmp_path / name).write_bytes(name.upper().encode())
    env = {**os.environ, "VLLM_PATCH_FAULT_AFTER_WRITES": "1"}
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(tmp_path)], env=env)
    assert proc.returncode == -9
    assert (tmp_path / "a").read_bytes() == b"A2" and (tmp_path / "b").read_bytes() == b"B"
    message = recover(journal(tmp_path))
    assert message and "rolled back" in message
    assert [(tmp_path / n).read_bytes() for n in "abc"] == [b"A", b"B", b"C"]
    assert recover(journal(tmp_path)) is None


def test_sigkill_after_the_last_write_is_completed(tmp_path):
    for name in "abc":
        (tmp_path / name).write_bytes(name.upper().encode())
    env = {**os.environ, "VLLM_PATCH_FAULT_AFTER_WRITES": "3"}
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(tmp_path)], env=env)
    assert proc.returncode == -9
    message = recover(journal(tmp_path))
    assert message and "completed" in message
    assert [(tmp_path / n).read_bytes() for n in "abc"] == [b"A2", b"B2", b"C2"]


def test_read_only_file_and_directory_are_refused_before_any_write(tmp_path):
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "ro").write_bytes(b"R")
    os.chmod(tmp_path / "ro", 0o444)
    with pytest.raises(TargetError, match="read-only"):
        commit(journal(tmp_path), {"a": b"A2", "ro": b"R2"})
    assert (tmp_path / "a").read_bytes() == b"A"
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "f").write_bytes(b"F")
    os.chmod(sub, 0o555)
    try:
        with pytest.raises(TargetError, match="read-only"):
            commit(journal(tmp_path), {"a": b"A2", "sub/f": b"F2"})
    finally:
        os.chmod(sub, 0o755)
    assert (tmp_path / "a").read_bytes() == b"A"


def test_symlink_leading_outside_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.py").write_bytes(b"secret")
    root = tmp_path / "root"
    root.mkdir()
    (root / "pkg").symlink_to(outside)
    with pytest.raises(TargetError, match="symlink leading outside"):
        read_files(root, ["pkg/f.py"])
    with pytest.raises(TargetError, match="symlink"):
        commit(journal(root), {"pkg/f.py": b"x"})
    assert (outside / "f.py").read_bytes() == b"secret"


def test_unreadable_journal_is_a_clear_error(tmp_path):
    (tmp_path / ".journal").mkdir()
    (tmp_path / ".journal" / "journal.json").write_text("{trunc")
    with pytest.raises(TargetError, match="unreadable"):
        recover(journal(tmp_path))


def test_directories_created_for_a_new_file_are_removed_on_rollback(tmp_path):
    def boom(extra):
        raise RuntimeError("late failure")

    with pytest.raises(RuntimeError):
        commit(journal(tmp_path), {"deep/er/new.py": b"n"}, extra={"x": 1}, finish=boom)
    assert not (tmp_path / "deep").exists()
