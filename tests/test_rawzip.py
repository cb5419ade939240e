"""Raw member copies: the compressed bytes move unchanged and the copy reads back as the original."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from vllm_patch.artifacts.rawzip import can_copy_raw, copy_raw, encrypted_members

MEMBERS = {"pkg/a.py": b"x = 1\n" * 500, "pkg/empty.py": b"", "pkg/data.bin": bytes(range(256)) * 40}


def _source(path: Path, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in MEMBERS.items():
            zf.writestr(name, data)
    return path


def _compressed(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
        zf.fp.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(zf.fp.read(2), "little"), int.from_bytes(zf.fp.read(2), "little")
        zf.fp.seek(info.header_offset + 30 + name_len + extra_len)
        return zf.fp.read(info.compress_size)


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
def test_copies_read_back_and_keep_their_compressed_bytes(tmp_path, compression):
    src_path = _source(tmp_path / "src.zip", compression)
    out = tmp_path / "out.zip"
    with zipfile.ZipFile(src_path) as src, zipfile.ZipFile(out, "w") as dst:
        dst.writestr("first.txt", b"written normally before the copies\n")
        for info in src.infolist():
            assert can_copy_raw(info)
            copy_raw(src, info, dst)
        dst.writestr("last.txt", b"and after them\n")
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        assert zf.namelist() == ["first.txt", *MEMBERS, "last.txt"]
        assert {n: zf.read(n) for n in MEMBERS} == MEMBERS
    for name in MEMBERS:
        assert _compressed(out, name) == _compressed(src_path, name)


def test_a_member_with_a_data_descriptor_is_not_copied_raw(tmp_path):
    buf = io.BytesIO()

    class Unseekable(io.RawIOBase):  # zipfile then writes a data descriptor after each member
        def writable(self) -> bool:
            return True

        def write(self, b) -> int:
            return buf.write(b)

    with zipfile.ZipFile(Unseekable(), "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/a.py", MEMBERS["pkg/a.py"])
    (tmp_path / "dd.zip").write_bytes(buf.getvalue())
    with zipfile.ZipFile(tmp_path / "dd.zip") as zf:
        info = zf.getinfo("pkg/a.py")
        assert info.flag_bits & 0x08
        assert not can_copy_raw(info)


def test_encrypted_members_are_listed_and_never_copied_raw(tmp_path):
    with zipfile.ZipFile(_source(tmp_path / "src.zip")) as zf:
        assert encrypted_members(zf) == []
        info = zf.getinfo("pkg/a.py")
        info.flag_bits |= 0x01
        assert encrypted_members(zf) == ["pkg/a.py"]
        assert not can_copy_raw(info)


def test_a_truncated_source_is_refused(tmp_path):
    src_path = _source(tmp_path / "src.zip")
    with zipfile.ZipFile(src_path) as src:
        info = src.getinfo("pkg/data.bin")
    data = src_path.read_bytes()
    cut = tmp_path / "cut.zip"
    cut.write_bytes(data[: info.header_offset + 40])
    with zipfile.ZipFile(src_path) as src, open(cut, "rb") as fh, zipfile.ZipFile(tmp_path / "out.zip", "w") as dst:
        original, src.fp = src.fp, fh  # the directory of the whole file, the bytes of the cut one
        original.close()
        with pytest.raises(zipfile.BadZipFile, match="truncated"):
            copy_raw(src, info, dst)


def test_a_bad_local_header_is_refused(tmp_path):
    src_path = _source(tmp_path / "src.zip")
    with zipfile.ZipFile(src_path) as src, zipfile.ZipFile(tmp_path / "out.zip", "w") as dst:
        info = src.getinfo("pkg/a.py")
        info.header_offset += 1
        with pytest.raises(zipfile.BadZipFile, match="bad local header for pkg/a.py"):
            copy_raw(src, info, dst)
