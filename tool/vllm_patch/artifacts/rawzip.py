"""Copy a zip member's compressed bytes as they are, so a 244 MB wheel is not
recompressed to change a few files.

zipfile has no public API for this; the copy writes the member's local header
and data verbatim and registers a ZipInfo so the central directory lists it.
"""

from __future__ import annotations

import copy
import struct
import zipfile

LOCAL_HEADER = struct.Struct("<4s5H3L2H")
CHUNK = 1 << 20
ENCRYPTED = 0x01
DATA_DESCRIPTOR = 0x08


def encrypted_members(zf: zipfile.ZipFile) -> list[str]:
    """Members flagged as encrypted. A wheel never has any: a raw copy would pass the ciphertext
    on unread, and zipfile cannot read them without a password."""
    return [info.filename for info in zf.infolist() if info.flag_bits & ENCRYPTED]


def can_copy_raw(info: zipfile.ZipInfo) -> bool:
    """Members with a trailing data descriptor are rewritten instead (rare in wheels); an encrypted one
    is never copied (the wheel builder refuses it first)."""
    return not info.flag_bits & (DATA_DESCRIPTOR | ENCRYPTED)


def copy_raw(src: zipfile.ZipFile, info: zipfile.ZipInfo, dst: zipfile.ZipFile) -> None:
    """Append `info` from `src` to `dst` (opened for writing) without recompressing it."""
    assert src.fp is not None and dst.fp is not None
    src.fp.seek(info.header_offset)
    header = src.fp.read(LOCAL_HEADER.size)
    fields = LOCAL_HEADER.unpack(header)
    if fields[0] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local header for {info.filename}")
    name_len, extra_len = fields[-2], fields[-1]
    remaining = name_len + extra_len + info.compress_size
    new = copy.copy(info)
    new.header_offset = dst.fp.tell()
    dst.fp.write(header)
    while remaining:
        block = src.fp.read(min(CHUNK, remaining))
        if not block:
            raise zipfile.BadZipFile(f"{info.filename} is truncated")
        dst.fp.write(block)
        remaining -= len(block)
    dst.filelist.append(new)
    dst.NameToInfo[new.filename] = new
    dst.start_dir = dst.fp.tell()
    dst._didModify = True
