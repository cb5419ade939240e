"""Test helpers: build real ``git format-patch`` series from successive edits of a tree."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

# The pin of the project's release line v0.20 (only its '#:' lines, less the later releases it declares with
# '#: also'), so test series pin what a real one pins: vLLM 0.20.0, whose real sdist and wheel the integration
# tests edit (tests/support/realvllm.py).
PIN_LINES = "".join(line + "\n" for line in
                    (Path(__file__).resolve().parents[2] / "lines" / "v0.20" / "series").read_text().splitlines()
                    if line.startswith("#:") and not line.startswith("#: also"))

VERSION_PY = b"__version__ = version = '0.20.0'\n__commit_id__ = commit_id = 'gb8160878f'\n"

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test Author", "GIT_AUTHOR_EMAIL": "author@example.org",
    "GIT_COMMITTER_NAME": "Test Committer", "GIT_COMMITTER_EMAIL": "committer@example.org",
    "GIT_AUTHOR_DATE": "2026-11-01T12:00:00Z", "GIT_COMMITTER_DATE": "2026-11-01T12:00:00Z",
}


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> bytes:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin, check=True,
                          capture_output=True).stdout


def write_tree(root: Path, files: dict[str, bytes | None]) -> None:
    for rel, data in files.items():
        path = root / rel
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` (no .git), for byte-exact comparisons."""
    out = {}
    for path in sorted(root.rglob("*")):
        if ".git" in path.relative_to(root).parts or not path.is_file() or path.is_symlink():
            continue
        out[str(path.relative_to(root))] = path.read_bytes()
    return out


def git_repo(root: Path, files: dict[str, bytes | None], tag: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "core.autocrlf", "false")
    write_tree(root, files)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    if tag:
        git(root, "tag", tag)
    return root


def build_series(dest: Path, base: dict[str, bytes], steps: list[tuple[str, dict[str, bytes | None]]],
                 work: Path | None = None, trailers: str = "Origin: vendor\nForwarded: no\n") -> Path:
    """Write ``dest/series`` and ``dest/patches/*.patch``: one patch per step, made by
    committing each step's edits on top of `base` and running git format-patch."""
    work = work or dest.with_name(dest.name + "-work")
    git_repo(work, base)
    for subject, changes in steps:
        write_tree(work, changes)
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", f"{subject}\n\nWhy this change.\n\n{trailers}")
    (dest / "patches").mkdir(parents=True, exist_ok=True)
    names = []
    if steps:
        out = git(work, "format-patch", "--no-renames", "-o", str((dest / "patches").resolve()), f"HEAD~{len(steps)}")
        names = [Path(line).name for line in out.decode().split()]
    (dest / "series").write_text("# test series\n" + PIN_LINES + "".join(n + "\n" for n in names))
    return dest


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in a fresh process, as a user runs it (the console script's entry point)."""
    return subprocess.run([sys.executable, "-m", "vllm_patch", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def make_site_packages(root: Path, files: dict[str, bytes], version: str = "0.20.0",
                       newline: str = "\n") -> Path:
    """A site-packages dir holding a vLLM 'installed' from `files`, with a real RECORD."""
    from vllm_patch.engine.record import make_line

    write_tree(root, files)
    dist = root / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (dist / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-linux_x86_64\n")
    entries = {**files, f"{dist.name}/METADATA": (dist / "METADATA").read_bytes(),
               f"{dist.name}/WHEEL": (dist / "WHEEL").read_bytes()}
    lines = [make_line(rel, data) for rel, data in entries.items()]
    lines.append(make_line(f"{dist.name}/RECORD", None))
    (dist / "RECORD").write_bytes("".join(line + newline for line in lines).encode())
    return root


def edit(data: bytes, old: bytes, new: bytes) -> bytes:
    """Replace a snippet that must occur exactly once."""
    assert data.count(old) == 1, old
    return data.replace(old, new)


class VllmLogger(logging.LoggerAdapter):
    """vLLM's logger for test harnesses that load vLLM files without vLLM: the standard one with its
    ``*_once`` methods (here every call logs)."""

    @classmethod
    def named(cls, name: str) -> VllmLogger:
        return cls(logging.getLogger(name), {})

    def info_once(self, msg, *args, **_):
        self.info(msg, *args)

    def warning_once(self, msg, *args, **_):
        self.warning(msg, *args)
