"""The parts of a stack bundle (gpu/stack_bundle.py): manifest, checks and assembly. Standard library only.

Both sides use it: stack_bundle.py writes the manifest here, where PyPI is reachable; gpu/stack.sh assembles
the staged parts on the GPU host (which may lack xz, rich and everything else vllm-patch needs):

    python3 gpu/stack_parts.py check PARTS              every part there, every sha256 right
    python3 gpu/stack_parts.py setup PARTS PREFIX       check, then unpack into PREFIX/site
    python3 gpu/stack_parts.py line DIR                 the release line a staged part folder belongs to

A failed check is one line on stderr (exit 2): which parts are missing, or which part's sha256 is wrong.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

MANIFEST = "manifest.json"
BLOCK = 1 << 20


class StackError(Exception):
    """A check that failed: one line, for the person staging the parts."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def write_manifest(out: Path, parts: list[Path], archive: Path, archive_sha256: str, info: dict) -> dict:
    """out/pNN/manifest.json in every part folder: the archive's and every part's sha256, plus info."""
    manifest = {
        **info,
        "archive": archive.name,
        "archive_bytes": archive.stat().st_size,
        "archive_sha256": archive_sha256,
        "parts": [{"path": str(p.relative_to(out)), "name": p.name, "bytes": p.stat().st_size,
                   "sha256": sha256_file(p)} for p in parts],
    }
    text = json.dumps(manifest, indent=1) + "\n"
    for folder in sorted({p.parent for p in parts}):
        (folder / MANIFEST).write_text(text)
    return manifest


def load_manifest(parts_dir: Path) -> dict:
    try:
        return json.loads((parts_dir / MANIFEST).read_text())
    except FileNotFoundError:
        raise StackError(f"no {MANIFEST} in {parts_dir}: stage the bundle's part folders first") from None
    except (OSError, ValueError) as exc:
        raise StackError(f"unreadable {parts_dir / MANIFEST}: {exc}") from None


def check(parts_dir: Path) -> dict:
    """The manifest, once every part is present with its sha256 and the whole archive has its sha256."""
    manifest = load_manifest(parts_dir)
    parts = manifest["parts"]
    missing = [p for p in parts if not (parts_dir / p["name"]).is_file()]
    if missing:
        folders = " ".join(str(Path(p["path"]).parent) for p in missing)
        raise StackError(f"{len(missing)} of {len(parts)} parts missing in {parts_dir}: stage {folders}")
    whole = hashlib.sha256()
    for p in parts:
        path = parts_dir / p["name"]
        h = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            while block := f.read(BLOCK):
                h.update(block)
                whole.update(block)
                size += len(block)
        if h.hexdigest() != p["sha256"]:
            raise StackError(f"part {p['name']} is corrupt ({size} bytes, sha256 {h.hexdigest()[:16]}..., expected "
                             f"{p['bytes']} bytes, {p['sha256'][:16]}...): stage {Path(p['path']).parent} again")
    if whole.hexdigest() != manifest["archive_sha256"]:
        raise StackError(f"the parts join to sha256 {whole.hexdigest()[:16]}..., not the archive's "
                         f"{manifest['archive_sha256'][:16]}...: rebuild the bundle")
    return manifest


class _Joined:
    """The parts read one after another, as one file (nothing joined on disk)."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths: Iterator[Path] = iter(paths)
        self._file = None

    def read(self, size: int = -1) -> bytes:
        out = bytearray()
        while size < 0 or len(out) < size:
            if self._file is None:
                path = next(self._paths, None)
                if path is None:
                    break
                self._file = open(path, "rb")  # noqa: SIM115 (closed when used up)
            block = self._file.read(BLOCK if size < 0 else size - len(out))
            if not block:
                self._file.close()
                self._file = None
                continue
            out += block
        return bytes(out)


def assemble(parts_dir: Path, prefix: Path) -> dict:
    """Check the parts, then unpack the archive into prefix/site (a new one: an old site is replaced whole)."""
    manifest = check(parts_dir)
    want = manifest.get("python")
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if want and want != have:
        raise StackError(f"the bundle is for Python {want}, this is {have} ({sys.executable}): set PYTHON")
    site, fresh = prefix / "site", prefix / "site.new"
    if fresh.exists():
        shutil.rmtree(fresh)
    fresh.mkdir(parents=True)
    joined = _Joined([parts_dir / p["name"] for p in manifest["parts"]])
    # The archive is several xz streams one after the other (one per component): LZMAFile reads them all.
    with lzma.LZMAFile(joined) as plain, tarfile.open(fileobj=plain, mode="r|") as tar:
        tar.extractall(fresh, filter="data")
    if site.exists():
        shutil.rmtree(site)
    fresh.rename(site)
    (prefix / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (prefix / ".complete").write_text(manifest.get("note", "") + "\n")
    return manifest


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "check":
            m = check(Path(argv[1]))
            print(f"{len(m['parts'])} parts, sha256 right: {m.get('note', '')}")
        elif len(argv) == 3 and argv[0] == "setup":
            m = assemble(Path(argv[1]), Path(argv[2]))
            print(f"unpacked into {argv[2]}/site: {m.get('note', '')}")
        elif len(argv) == 2 and argv[0] == "line":
            print(load_manifest(Path(argv[1]))["line"])
        else:
            print("usage: stack_parts.py check PARTS | setup PARTS PREFIX | line DIR", file=sys.stderr)
            return 2
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
