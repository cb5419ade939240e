from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_patch.errors import TargetError
from vllm_patch.infrastructure import transaction
from vllm_patch.infrastructure.transaction import Journal, commit, read_files, recover


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


def test_renames_and_deletions_are_durable_before_the_journal_goes(tmp_path, monkeypatch):
    """A file's fsync does not cover its name: each changed file's folder (for a pruned folder, the
    one that remains) is synced before the journal file, the commit point, is removed."""
    (tmp_path / "a").write_bytes(b"old")
    (tmp_path / "p/q").mkdir(parents=True)
    (tmp_path / "p/q/gone").write_bytes(b"x")
    events: list[tuple[str, str]] = []
    fsync, unlink = os.fsync, os.unlink

    def recording_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def recording_unlink(path, *args, **kwargs):
        events.append(("unlink", str(path)))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "unlink", recording_unlink)
    commit(journal(tmp_path), {"a": b"new", "d/e/new": b"n", "p/q/gone": None})
    assert not (tmp_path / "p").exists()
    closed = events.index(("unlink", str(tmp_path / ".journal/journal.json")))
    synced = {path for what, path in events[:closed] if what == "fsync"}
    assert {str(tmp_path), str(tmp_path / "d/e")} <= synced


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
from vllm_patch.infrastructure.transaction import Journal, commit
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


# --- Real SIGKILLs anywhere in the write phase: recovery leaves exactly the old or exactly the new tree.

BIG = bytes(range(256)) * 256  # 64 KiB, so that writes take measurable time
BEFORE = {"pkg/a.py": b"A" * 100, "pkg/b.py": BIG, "old/only.py": b"O\n", **{f"pkg/m{i}.py": BIG for i in range(6)}}
AFTER = {"pkg/a.py": b"A2", "pkg/b.py": BIG[::-1], "old/only.py": None, "new/deep/c.py": b"C\n",
         **{f"pkg/m{i}.py": BIG[1:] + b"!" for i in range(6)}}

CHILD = """
import pickle, sys
from pathlib import Path
from vllm_patch.infrastructure.transaction import Journal, commit
root = Path(sys.argv[1])
changes = pickle.loads(Path(sys.argv[2]).read_bytes())
print("ready", flush=True)
sys.stdin.readline()
commit(Journal(root, root / ".journal"), changes)
print("done", flush=True)
"""


def fill(root: Path) -> Path:
    for rel, data in BEFORE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def listing(root: Path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and directory (None) under root."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def expected(state: dict) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for rel, data in state.items():
        if data is not None:
            parts = rel.split("/")
            out.update({"/".join(parts[:i]): None for i in range(1, len(parts))})
            out[rel] = data
    return dict(sorted(out.items()))


def child(root: Path, env: dict | None = None) -> subprocess.Popen:
    import pickle
    changes = root.with_name(root.name + ".changes")
    changes.write_bytes(pickle.dumps(AFTER))
    return subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(changes)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def kill_and_recover(root: Path, env: dict | None = None, delay: float | None = None) -> str | None:
    proc = child(root, env)
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write("go\n")
    proc.stdin.flush()
    if delay is not None:
        import time
        time.sleep(delay)
        proc.kill()
    proc.wait(timeout=60)
    return recover(journal(root))


def test_sigkill_between_a_temporary_write_and_its_rename(tmp_path):
    """The hook kills right after the Nth temporary file is written, before its rename: the temporary
    file is there after the kill, and recovery removes it with the rest of the run."""
    base, new = expected(BEFORE), expected(AFTER)
    writes = sum(1 for d in AFTER.values() if d is not None)
    for n in range(1, writes + 1):
        root = fill(tmp_path / f"r{n}")
        proc = child(root, {"VLLM_PATCH_FAULT_BEFORE_RENAME": str(n)})
        assert proc.stdout.readline().strip() == "ready"
        proc.communicate("go\n", timeout=60)
        assert proc.returncode == -9
        assert [p.name for p in root.rglob("*.vllm-patch-tmp")], "the kill left no temporary file"
        message = recover(journal(root))
        assert message and "rolled back" in message
        assert listing(root) == base, n
        assert recover(journal(root)) is None
        assert listing(root) != new


def test_sigkill_after_each_write(tmp_path):
    base, new = expected(BEFORE), expected(AFTER)
    for n in range(1, len(AFTER) + 1):
        root = fill(tmp_path / f"r{n}")
        proc = child(root, {"VLLM_PATCH_FAULT_AFTER_WRITES": str(n)})
        assert proc.stdout.readline().strip() == "ready"
        proc.communicate("go\n", timeout=60)
        assert proc.returncode == -9
        recover(journal(root))
        assert listing(root) == (new if n == len(AFTER) else base), n


def test_timed_sigkills_anywhere_in_the_run(tmp_path):
    """SIGKILL at times spread over a whole run (backups, journal, writes, renames, cleanup)."""
    import time
    base, new = expected(BEFORE), expected(AFTER)
    root = fill(tmp_path / "calibrate")
    start = time.monotonic()
    assert kill_and_recover(root) is None
    span = time.monotonic() - start
    assert listing(root) == new
    seen = set()
    for i in range(30):
        root = fill(tmp_path / f"k{i}")
        kill_and_recover(root, delay=span * i / 25)
        result = listing(root)
        assert result in (base, new), (i, sorted(set(result) ^ set(base)))
        seen.add("new" if result == new else "base")
    assert seen  # which side each kill lands on depends on the machine's speed


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_while_writing_names_the_file_and_rolls_back(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(b"old a")
    (tmp_path / "b").write_bytes(b"old b")
    real = transaction.atomic_write

    def full_disk(path, data, *args, **kwargs):
        if path == tmp_path / "b":
            raise _enospc()
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(transaction, "atomic_write", full_disk)
    with pytest.raises(TargetError) as info:
        commit(journal(tmp_path), {"a": b"new a", "b": b"new b"})
    assert info.value.message == f"cannot write {tmp_path / 'b'}: No space left on device; nothing was changed"
    assert (tmp_path / "a").read_bytes() == b"old a" and (tmp_path / "b").read_bytes() == b"old b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_full_disk_while_backing_up_names_the_backup(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(b"old a")
    real = Path.write_bytes

    def full_disk(self, data):
        if self.parent == tmp_path / ".journal":
            raise _enospc()
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(TargetError) as info:
        commit(journal(tmp_path), {"a": b"new a"})
    assert info.value.message == (f"cannot write {tmp_path / '.journal' / 'backup-0'}: No space left on device; "
                                  "nothing was changed")
    assert (tmp_path / "a").read_bytes() == b"old a" and sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_rollback_that_fails_too_says_the_next_run_restores(tmp_path, monkeypatch):
    """Nothing-was-changed is said only where it holds: a full disk that also stops the rollback leaves the
    journal, and the message says the next run restores the files from it."""
    (tmp_path / "a").write_bytes(b"old a")
    (tmp_path / "b").write_bytes(b"old b")
    real, written = transaction.atomic_write, []

    def full_disk(path, data, *args, **kwargs):
        if path.parent == tmp_path:
            if written:
                raise _enospc()
            written.append(path)
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(transaction, "atomic_write", full_disk)
    with pytest.raises(TargetError) as info:
        commit(journal(tmp_path), {"a": b"new a", "b": b"new b"})
    message = info.value.message
    assert message.startswith(f"cannot write {tmp_path / 'b'}: No space left on device;")
    assert "nothing was changed" not in message and str(tmp_path / ".journal") in message
    monkeypatch.setattr(transaction, "atomic_write", real)
    assert recover(journal(tmp_path)).startswith("rolled back")
    assert (tmp_path / "a").read_bytes() == b"old a" and (tmp_path / "b").read_bytes() == b"old b"
