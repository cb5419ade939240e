"""The downloader against a real HTTP index served on loopback."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading
import time
from pathlib import Path

import pytest

from vllm_patch.engine.pin import Artifact
from vllm_patch.errors import DownloadError
from vllm_patch.infrastructure import downloads as upstream


def make_sdist() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"__version__ = '0.20.0'\n"
        info = tarfile.TarInfo("vllm-0.20.0/vllm/_version.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A PEP 691 index on 127.0.0.1 serving one sdist; `files` can be edited by tests."""
    payload = make_sdist()
    state = {"payload": payload, "indexed": hashlib.sha256(payload).hexdigest()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's API
            if self.path == "/simple/vllm/":
                body = json.dumps({"files": [{"filename": "vllm-0.20.0.tar.gz",
                                              "url": f"http://127.0.0.1:{port}/files/vllm-0.20.0.tar.gz",
                                              "hashes": {"sha256": state["indexed"]}}]}).encode()
            elif self.path == "/files/vllm-0.20.0.tar.gz":
                body = state["payload"]
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            delay = state.get("chunk_delay")
            step = 1 << 16 if delay else len(body) or 1
            for at in range(0, len(body), step):
                self.wfile.write(body[at:at + step])
                if delay:
                    time.sleep(delay)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("VLLM_PATCH_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    yield state
    server.shutdown()


def test_download_is_checked_cached_and_unpacked(index, tmp_path):
    artifact = Artifact("vllm-0.20.0.tar.gz", hashlib.sha256(index["payload"]).hexdigest())
    path = upstream.fetch(artifact, quiet=True)
    assert path.read_bytes() == index["payload"]
    index["payload"] = b"served differently now"
    assert upstream.fetch(artifact, quiet=True).read_bytes() != index["payload"]  # from the cache
    tree = upstream.unpack_sdist(path, artifact.sha256, tmp_path / "trees")
    assert (tree / "vllm/_version.py").is_file()
    assert upstream.unpack_sdist(path, artifact.sha256, tmp_path / "trees") == tree


def test_sha256_mismatch_leaves_nothing_in_the_cache(index, tmp_path):
    artifact = Artifact("vllm-0.20.0.tar.gz", "0" * 64)
    index["indexed"] = "0" * 64  # the index agrees with the pin, the bytes do not
    with pytest.raises(DownloadError, match="does not match the pin"):
        upstream.fetch(artifact, quiet=True)
    assert not any((tmp_path / "cache" / "downloads").iterdir())


def test_index_hash_differing_from_the_pin_is_refused(index):
    with pytest.raises(DownloadError, match="the index says sha256"):
        upstream.fetch(Artifact("vllm-0.20.0.tar.gz", "1" * 64), quiet=True)


def test_unknown_file_and_unreachable_index(index, monkeypatch):
    with pytest.raises(DownloadError, match="is not on"):
        upstream.fetch(Artifact("vllm-9.9.9.tar.gz", "1" * 64), quiet=True)
    monkeypatch.setenv("VLLM_PATCH_INDEX_URL", "http://127.0.0.1:9/simple")
    with pytest.raises(DownloadError, match="cannot list"):
        upstream.fetch(Artifact("vllm-9.9.9.tar.gz", "1" * 64), quiet=True)


def test_corrupted_cached_file_is_downloaded_again(index):
    artifact = Artifact("vllm-0.20.0.tar.gz", hashlib.sha256(index["payload"]).hexdigest())
    path = upstream.fetch(artifact, quiet=True)
    path.write_bytes(b"bit rot")
    assert upstream.fetch(artifact, quiet=True).read_bytes() == index["payload"]


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "c"))
    assert upstream.cache_root() == Path(tmp_path / "c")


def test_indexed_artifact_takes_the_index_hash_and_fetch_checks_the_bytes(index):
    artifact = upstream.indexed_artifact("vllm", "vllm-0.20.0.tar.gz")
    assert artifact.sha256 == index["indexed"]
    index["payload"] = b"tampered after indexing"
    with pytest.raises(DownloadError, match="does not match"):
        upstream.fetch(artifact, quiet=True)


def test_concurrent_fetches_of_one_artifact_both_succeed(index):
    """Two runs downloading the same file at once (two CI jobs on one cache) must not share a
    partial file: each writes its own, and the cache ends with the checked bytes."""
    index["payload"] = index["payload"] + b"\0" * (4 << 20)  # a tar.gz with trailing zeros: still the bytes to check
    index["indexed"] = hashlib.sha256(index["payload"]).hexdigest()
    index["chunk_delay"] = 0.002
    artifact = Artifact("vllm-0.20.0.tar.gz", index["indexed"])
    results: list[object] = []

    def fetch():
        try:
            results.append(upstream.fetch(artifact, quiet=True))
        except Exception as exc:  # noqa: BLE001 - the test reports whatever a run raised
            results.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, Path) for r in results), results
    assert hashlib.sha256(results[0].read_bytes()).hexdigest() == index["indexed"]
    assert sorted(p.name for p in results[0].parent.iterdir()) == ["vllm-0.20.0.tar.gz"]
    assert results[0].stat().st_mode & 0o777 == 0o644


def test_download_off_a_terminal_says_every_tenth_in_one_line(index, capsys):
    """A CI log or a pipe gets one line per 10% of the download, not a bar and not silence."""
    payload = bytes(range(256)) * (11 * 4096)  # 11 MiB: read in 1 MiB blocks, one line per tenth
    index["payload"], index["indexed"] = payload, hashlib.sha256(payload).hexdigest()
    path = upstream.fetch(Artifact("vllm-0.20.0.tar.gz", index["indexed"]))
    assert path.read_bytes() == payload
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert [line.split(": ", 1)[1].split("%")[0] for line in lines] == [str(p) for p in range(10, 101, 10)]
    assert all(line.startswith("downloading vllm-0.20.0.tar.gz: ") for line in lines)
    assert lines[-1].endswith("(11.5 of 11.5 MB)")


def test_quiet_download_says_nothing(index, capsys):
    upstream.fetch(Artifact("vllm-0.20.0.tar.gz", index["indexed"]), quiet=True)
    assert capsys.readouterr().err == ""
