"""The wheel RECORD file: check files against it and rewrite entries, line by line.

Lines are kept as they are except the ones a change touches, so a revert can
put the original lines back and the file is byte-identical again.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from dataclasses import dataclass

from installer.records import Hash, InvalidRecordEntry, RecordEntry, parse_record_file

from ..errors import TargetError


def record_hash(data: bytes) -> str:
    """``sha256=<urlsafe base64, no padding>`` as RECORD writes it."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


@dataclass
class RecordText:
    """RECORD as lines without terminators, with the terminator it uses and whether
    its last line has one, so it can be written back byte for byte."""

    lines: list[str]
    newline: str = "\n"
    final_newline: bool = True

    def text(self, lines: list[str] | None = None) -> str:
        lines = self.lines if lines is None else lines
        out = self.newline.join(lines)
        return out + self.newline if lines and self.final_newline else out


def parse_lines(text: str) -> RecordText:
    """RECORD split into lines, with what `RecordText.text` needs to give the same bytes back."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.split(newline)
    final = bool(lines) and lines[-1] == ""
    if final:
        lines.pop()
    return RecordText(lines, newline, final or not text)


def entry_of(line: str) -> RecordEntry | None:
    """Parse one RECORD line with pypa/installer; None for a malformed line."""
    try:
        path, hash_, size = next(iter(parse_record_file([line])))
        return RecordEntry.from_elements(path, hash_, size)
    except (ValueError, StopIteration, csv.Error, InvalidRecordEntry):
        return None


def entry_at(lines: list[str], number: int, where: str) -> RecordEntry:
    """The entry on line `number` (0-based) of the RECORD `where`; a malformed line is a TargetError."""
    entry = entry_of(lines[number])
    if entry is None:
        raise TargetError(f"{where} line {number + 1} is malformed ({lines[number][:80]!r}); "
                          "reinstall vLLM to get a sound RECORD")
    return entry


def index(lines: list[str]) -> dict[str, int]:
    """Path -> line number, read with one csv pass (RECORDs list thousands of files)."""
    try:
        return {row[0]: i for i, row in enumerate(csv.reader(lines)) if len(row) == 3}
    except csv.Error as exc:
        raise TargetError(f"a RECORD is not valid CSV ({exc}); reinstall vLLM to get a sound RECORD") from None


def entries(lines: list[str], paths: list[str] | None = None,
            where: str = "RECORD") -> dict[str, tuple[int, RecordEntry]]:
    """Path -> (line number, entry) for `paths` (default: every line); a malformed
    line among them is a TargetError naming `where` and the line."""
    at = index(lines)
    return {path: (at[path], entry_at(lines, at[path], where)) for path in (at if paths is None else paths)
            if path in at}


def line_of(entry: RecordEntry) -> str:
    """`entry` as one RECORD line (csv quoting as pip writes it, no terminator)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(entry.to_row())
    return buf.getvalue()


def make_line(path: str, data: bytes | None) -> str:
    """A RECORD line for `path` with `data` (no hash for files whose contents change, like RECORD)."""
    if data is None:
        entry = RecordEntry(path, None, None)
    else:
        name, _, value = record_hash(data).partition("=")
        entry = RecordEntry(path, Hash(name, value), len(data))
    return line_of(entry)


def matches(entry: RecordEntry, data: bytes) -> bool:
    """True when `data` has the hash and size the entry records."""
    return entry.validate_stream(io.BytesIO(data))
