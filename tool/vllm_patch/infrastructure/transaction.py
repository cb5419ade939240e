"""All-or-nothing writes of a set of files, under a journal.

Protocol: back up every file to change into a journal directory, write the
journal (its presence means "a write is in progress"), replace each file by
writing a temporary file beside it and renaming it into place, then remove
the journal. After a crash, `recover` finishes the run when every file
already has its new contents, and otherwise restores every backup; either
way it removes the temporary files a kill left beside the files (a SIGKILL
between a temporary file's write and its rename leaves one), so the target
holds exactly the old or exactly the new bytes and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import TargetError, VllmPatchError

JOURNAL_FILE = "journal.json"
FAULT_ENV = "VLLM_PATCH_FAULT_AFTER_WRITES"
# Test hook: SIGKILL once the Nth temporary file of the write phase is written, before its rename.
FAULT_TMP_ENV = "VLLM_PATCH_FAULT_BEFORE_RENAME"
TMP_SUFFIX = ".vllm-patch-tmp"


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def resolve_inside(root: Path, rel: str) -> Path:
    """The absolute path of `rel` under `root`, refusing symlinks on the way."""
    path = root
    for part in Path(rel).parts:
        path = path / part
        if path.is_symlink():
            target = os.path.realpath(path)
            inside = os.path.commonpath([os.path.realpath(root), target]) == os.path.realpath(root)
            where = "inside" if inside else "outside"
            raise TargetError(f"{rel}: {path} is a symlink leading {where} the target "
                              f"(to {target}); refusing to write through it")
    return path


def read_files(root: Path, paths: list[str]) -> dict[str, bytes | None]:
    """Read files under `root` (None when absent), refusing symlinks and non-files."""
    out: dict[str, bytes | None] = {}
    for rel in paths:
        path = resolve_inside(root, rel)
        if not path.exists():
            out[rel] = None
        elif not path.is_file():
            raise TargetError(f"{rel}: {path} is not a regular file")
        else:
            try:
                out[rel] = path.read_bytes()
            except OSError as exc:
                raise TargetError(f"cannot read {path}: {exc.strerror}") from None
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_of(path: Path) -> Path:
    """The temporary file `atomic_write` writes beside `path`."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def atomic_write(path: Path, data: bytes, mode: int | None = None,
                 before_rename: Callable[[], None] | None = None) -> None:
    """Write `data` to a temporary file beside `path`, then rename it into place."""
    tmp = temporary_of(path)
    if mode is None:
        mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _is_read_only(path: Path) -> bool:
    return not stat.S_IMODE(path.stat().st_mode) & stat.S_IWUSR


def preflight(root: Path, changes: Mapping[str, bytes | None]) -> None:
    """Refuse before any write when a file or directory to change is not writable."""
    probed: set[Path] = set()
    for rel in changes:
        path = resolve_inside(root, rel)
        if path.exists() and _is_read_only(path):
            raise TargetError(f"{path} is read-only; nothing was changed")
        parent = path.parent
        while not parent.exists() and parent != root:
            parent = parent.parent
        if parent in probed:
            continue
        probed.add(parent)
        if _is_read_only(parent):
            raise TargetError(f"{parent} is read-only; nothing was changed")
        # access(2), not a probe file: a kill between a probe's creation and its removal would
        # leave a file that no journal knows of. It also sees read-only mounts (EROFS).
        if not os.access(parent, os.W_OK | os.X_OK):
            raise TargetError(f"{parent} is not writable; nothing was changed")


JOURNAL_DIR = ".vllm-patch-journal"


@dataclass
class Journal:
    """The journal directory of one target (or of the series directory)."""

    root: Path
    directory: Path

    @classmethod
    def of(cls, root: Path, owner: str = "") -> Journal:
        """The journal kept in `root`; `owner` tells apart several journals of one directory
        (one per distribution in a site-packages)."""
        return cls(root, root / (f"{JOURNAL_DIR}-{owner}" if owner else JOURNAL_DIR))

    @property
    def file(self) -> Path:
        return self.directory / JOURNAL_FILE

    def pending(self) -> bool:
        return self.file.exists()

    def load(self) -> dict:
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
            for entry in data["entries"]:
                entry["path"], entry["before"], entry["after"], entry["backup"]  # noqa: B018 - shape check
            return data
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TargetError(f"the journal {self.file} of an interrupted run is unreadable ({exc}); "
                              "restore the target by hand (reinstall vLLM or git checkout), then delete "
                              f"{self.directory}") from None


def _fault_countdown(env: str = FAULT_ENV) -> Callable[[], None]:
    """A test hook: SIGKILL this process at the Nth call (N from `env`), to prove recovery."""
    left = int(os.environ.get(env, "0") or 0)

    def tick() -> None:
        nonlocal left
        if left > 0:
            left -= 1
            if left == 0:
                os.kill(os.getpid(), signal.SIGKILL)
    return tick


def commit(journal: Journal, changes: Mapping[str, bytes | None],
           modes: Mapping[str, int] | None = None, extra: dict | None = None,
           finish: Callable[[dict], None] | None = None,
           undo: Callable[[dict], None] | None = None) -> None:
    """Write every change or none. `finish` runs last (e.g. move a git ref), still
    under the journal, and receives `extra`; `undo` reverses it on failure."""
    root = journal.root
    changes = {p: d for p, d in changes.items()}
    if not changes and finish is None:
        return
    preflight(root, changes)
    if journal.directory.exists():
        raise TargetError(f"a journal is already present at {journal.directory}")
    entries = []
    writing: Path | None = journal.directory
    try:
        journal.directory.mkdir(parents=True)
        for i, (rel, data) in enumerate(changes.items()):
            path = resolve_inside(root, rel)
            writing = None
            old = path.read_bytes() if path.exists() else None
            backup = None
            if old is not None:
                backup = f"backup-{i}"
                writing = journal.directory / backup
                writing.write_bytes(old)
            missing_dirs = []
            parent = path.parent
            while not parent.exists():
                missing_dirs.append(str(parent.relative_to(root)))
                parent = parent.parent
            entries.append({
                "path": rel, "before": sha256(old), "after": sha256(data), "backup": backup,
                "mode": stat.S_IMODE(path.stat().st_mode) if old is not None else None,
                "new_mode": (modes or {}).get(rel), "created_dirs": missing_dirs,
            })
        writing = journal.directory
        for f in journal.directory.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        writing = journal.file
        atomic_write(journal.file, json.dumps({"entries": entries, "extra": extra or {}}).encode())
        _fsync_dir(journal.directory)
    except OSError as exc:
        shutil.rmtree(journal.directory, ignore_errors=True)
        raise TargetError(f"{_failed(writing, exc)}; nothing was changed") from None
    except BaseException:
        shutil.rmtree(journal.directory, ignore_errors=True)
        raise
    tick, tick_tmp = _fault_countdown(), _fault_countdown(FAULT_TMP_ENV)
    writing = None
    try:
        for entry in entries:
            rel = entry["path"]
            data = changes[rel]
            path = writing = resolve_inside(root, rel)
            if data is None:
                path.unlink(missing_ok=True)
            else:
                for d in reversed(entry["created_dirs"]):
                    (root / d).mkdir(exist_ok=True)
                atomic_write(path, data, entry["mode"] if entry["mode"] is not None else entry["new_mode"],
                             before_rename=tick_tmp)
            tick()
        writing = None
        _prune(root, entries)
        if finish is not None:
            finish(extra or {})
    except OSError as exc:
        _undo_after(journal, undo, extra, _failed(writing, exc))
        raise TargetError(f"{_failed(writing, exc)}; nothing was changed") from None
    except BaseException:
        try:
            if undo is not None:
                undo(extra or {})
        finally:
            rollback(journal)
        raise
    _close(journal, entries)


def _failed(writing: Path | None, exc: OSError) -> str:
    """What failed, naming the file: a failed write (ENOSPC, EIO) carries no file name of its own."""
    path = exc.filename if exc.filename else writing
    reason = exc.strerror or str(exc)
    if path is None:
        return reason
    return f"cannot write {path}: {reason}" if writing is not None else f"{path}: {reason}"


def _undo_after(journal: Journal, undo: Callable[[dict], None] | None, extra: dict | None, failure: str) -> None:
    """Roll back after a failed write; when the rollback fails too (the same full disk), say that the
    journal stays and the next run on the target restores the files from it, instead of "nothing was
    changed"."""
    try:
        try:
            if undo is not None:
                undo(extra or {})
        finally:
            rollback(journal)
    except (OSError, VllmPatchError) as again:
        why = again.message if isinstance(again, VllmPatchError) else again.strerror or str(again)
        raise TargetError(f"{failure}; the rollback failed too ({why}): the next vllm-patch run on "
                          f"{journal.root} restores every file from the journal {journal.directory}") from None


def _sync_parents(root: Path, entries: list[dict]) -> None:
    """Make the renames, deletions and removed folders of `entries` durable: a file's fsync does not
    cover its name, so after a power cut the journal could be gone while a rename is not."""
    folders = set()
    for entry in entries:
        parent = (root / entry["path"]).parent
        while not parent.exists() and parent != root:  # pruned: its nearest remaining ancestor
            parent = parent.parent
        folders.add(parent)
    for folder in sorted(folders):
        _fsync_dir(folder)


def _close(journal: Journal, entries: list[dict]) -> None:
    """Remove the journal once every change it guards is durable: its file first (the commit
    point), then the backups."""
    _sync_parents(journal.root, entries)
    journal.file.unlink()
    _fsync_dir(journal.directory)
    shutil.rmtree(journal.directory)
    _fsync_dir(journal.directory.parent)


def _prune(root: Path, entries: list[dict]) -> None:
    """Remove the directories that deleting files left empty (a reverted patch's new package),
    up to the first one still holding something; never `root` itself."""
    for entry in entries:
        if entry["after"] is not None:
            continue
        parent = (root / entry["path"]).parent
        while parent != root and root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


def _remove_temporaries(journal: Journal, entries: list[dict]) -> None:
    """Delete the temporary files a killed write phase left beside the journal's files."""
    for entry in entries:
        temporary_of(journal.root / entry["path"]).unlink(missing_ok=True)


def rollback(journal: Journal) -> None:
    """Restore every file recorded in the journal to its contents before the run."""
    data = journal.load()
    _remove_temporaries(journal, data["entries"])
    for entry in reversed(data["entries"]):
        path = journal.root / entry["path"]
        current = path.read_bytes() if path.is_file() else None
        if sha256(current) != entry["before"]:
            if entry["backup"] is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)  # a deletion may have pruned it
                atomic_write(path, (journal.directory / entry["backup"]).read_bytes(), entry["mode"])
        for d in entry["created_dirs"]:
            try:
                (journal.root / d).rmdir()
            except OSError:
                pass
    _close(journal, data["entries"])


def recover(journal: Journal, finish: Callable[[dict], None] | None = None,
            undo: Callable[[dict], None] | None = None) -> str | None:
    """Complete or undo an interrupted run; say which, or None when there was none."""
    if not journal.directory.exists():
        return None
    if not journal.pending():
        # Killed while backing up (no target file was touched yet), or while removing
        # the journal of a finished run: either way the files are whole.
        shutil.rmtree(journal.directory)
        return "removed the journal of an interrupted run (it had written nothing, or everything)"
    data = journal.load()
    _remove_temporaries(journal, data["entries"])
    done = all(
        sha256((journal.root / e["path"]).read_bytes() if (journal.root / e["path"]).is_file() else None)
        == e["after"]
        for e in data["entries"]
    )
    if done:
        _prune(journal.root, data["entries"])
        if finish is not None:
            finish(data.get("extra", {}))
        _close(journal, data["entries"])
        return f"completed an interrupted run ({len(data['entries'])} files were already written)"
    if undo is not None:
        undo(data.get("extra", {}))
    rollback(journal)
    return f"rolled back an interrupted run ({len(data['entries'])} files restored to their state before it)"


class SeriesDir:
    """The series directory as a place that commands write (rebase, refresh, new, import):
    its journal and its lock, so those writes are all-or-nothing and never interleave."""

    def __init__(self, root: Path, wait: float = 0.0) -> None:
        self.root = root
        self.wait = wait
        self.journal = Journal.of(root)

    def recover(self) -> str | None:
        """Finish or undo an interrupted write of the series, under the lock."""
        from .locking import target_lock

        with target_lock(self.root, self.wait):
            return recover(self.journal)

    def write(self, changes: Mapping[str, bytes | None]) -> None:
        """Write `changes` (path -> new bytes, None: delete), skipping files that already hold them."""
        from .locking import target_lock

        with target_lock(self.root, self.wait):
            recover(self.journal)
            current = read_files(self.root, list(changes))
            commit(self.journal, {rel: data for rel, data in changes.items() if current[rel] != data})
