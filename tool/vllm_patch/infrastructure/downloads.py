"""The pinned upstream artifacts: found on a PEP 691 package index, downloaded with a
progress bar (one line every 10% when stderr is no terminal), sha256-checked, and cached
in the user's cache directory."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from platformdirs import user_cache_path

from ..engine.pin import Artifact, Pin
from ..errors import DownloadError
from .progress import transfer

DEFAULT_INDEX = "https://pypi.org/simple"


def cache_root() -> Path:
    """$VLLM_PATCH_CACHE, else the platform's user cache dir (~/.cache/vllm-patch)."""
    env = os.environ.get("VLLM_PATCH_CACHE")
    return Path(env) if env else user_cache_path("vllm-patch")


def index_url() -> str:
    return os.environ.get("VLLM_PATCH_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def index_files(project: str, wanted: str) -> list[dict]:
    """The files the index's JSON simple API lists for `project`."""
    url = f"{index_url()}/{project}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return list(json.load(resp).get("files", []))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DownloadError(f"cannot list {url}: {exc}; put {wanted} in "
                            f"{cache_root() / 'downloads'} by hand to work offline") from None


def _entry(project: str, filename: str) -> dict:
    for entry in index_files(project, filename):
        if entry.get("filename") == filename:
            return entry
    raise DownloadError(f"{filename} is not on {index_url()}/{project}/")


def indexed_artifact(project: str, filename: str) -> Artifact:
    """An artifact with the sha256 the index publishes for it (for releases the series is not pinned to)."""
    digest = _entry(project, filename).get("hashes", {}).get("sha256")
    if not digest:
        raise DownloadError(f"the index gives no sha256 for {filename}; refusing it")
    return Artifact(filename, digest)


def find_url(project: str, artifact: Artifact) -> str:
    """The download URL of `artifact`; the index's recorded sha256 must equal the expected one."""
    entry = _entry(project, artifact.filename)
    indexed = entry.get("hashes", {}).get("sha256")
    if indexed and indexed != artifact.sha256:
        raise DownloadError(f"{artifact.filename}: the index says sha256 {indexed}, the pin "
                            f"says {artifact.sha256}; refusing it")
    return entry["url"]


def fetch(artifact: Artifact, project: str = "vllm", quiet: bool = False) -> Path:
    """The cached artifact, downloading it first when needed; always sha256-checked."""
    dest = cache_root() / "downloads" / artifact.filename
    if dest.is_file():
        if file_sha256(dest) == artifact.sha256:
            return dest
        dest.unlink(missing_ok=True)  # another run may be replacing it right now
    url = find_url(project, artifact)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A partial file of its own: two runs filling one cache at once must not write into each other's.
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    part = Path(name)
    os.fchmod(fd, 0o644)  # as open() would make it, not mkstemp's 0600: the image build copies it
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=120) as resp, \
                transfer(f"downloading {artifact.filename}", int(resp.headers.get("Content-Length") or 0) or None,
                         quiet) as advance:
            for block in iter(lambda: resp.read(1 << 20), b""):
                out.write(block)
                h.update(block)
                advance(len(block))
    except (urllib.error.URLError, OSError) as exc:
        part.unlink(missing_ok=True)
        raise DownloadError(f"downloading {url} failed: {exc}") from None
    if h.hexdigest() != artifact.sha256:
        part.unlink(missing_ok=True)
        raise DownloadError(f"{artifact.filename}: sha256 {h.hexdigest()} does not match the pin "
                            f"{artifact.sha256}")
    os.replace(part, dest)
    return dest


def unpack_sdist(archive: Path, sha256: str, dest_root: Path) -> Path:
    """Unpack an sdist once into the cache; return its top directory."""
    dest = dest_root / f"{archive.name.removesuffix('.tar.gz')}-{sha256[:12]}"
    marker = dest / ".complete"
    if marker.is_file():
        return next(p for p in dest.iterdir() if p.is_dir())
    if file_sha256(archive) != sha256:
        raise DownloadError(f"{archive}: sha256 does not match the pin {sha256}")
    shutil.rmtree(dest, ignore_errors=True)
    dest_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest_root))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)  # noqa: S202 - Python < 3.10.12 has no filter
        (tmp / ".complete").write_text("ok\n")
        os.replace(tmp, dest)
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DownloadError(f"cannot unpack {archive}: {exc}") from None
    return next(p for p in dest.iterdir() if p.is_dir())


def pinned_base_tree(pin: Pin, quiet: bool = False) -> Path:
    """The pinned release's source tree, from the sha256-checked PyPI sdist."""
    archive = fetch(pin.sdist, quiet=quiet)
    return unpack_sdist(archive, pin.sdist.sha256, cache_root() / "trees")
