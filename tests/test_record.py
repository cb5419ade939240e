"""The RECORD model: hashes as pip writes them, byte-exact round trips, malformed lines named."""

from __future__ import annotations

import base64
import hashlib

import pytest
from installer.records import RecordEntry

from vllm_patch.engine import record
from vllm_patch.errors import TargetError


def test_record_hash_is_urlsafe_base64_without_padding():
    data = b"print('hi')\n"
    raw = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
    assert raw.endswith("=")
    assert record.record_hash(data) == "sha256=" + raw.rstrip("=")
    assert record.record_hash(b"") == "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"


@pytest.mark.parametrize("text", [
    "a.py,sha256=x,1\nb.py,,\n",
    "a.py,sha256=x,1\r\nb.py,,\r\n",
    "a.py,sha256=x,1\nb.py,,",   # no final newline
    "",
])
def test_lines_are_written_back_byte_for_byte(text):
    parsed = record.parse_lines(text)
    assert parsed.text() == text
    assert "" not in parsed.lines


def test_a_changed_line_keeps_the_files_newline_style():
    parsed = record.parse_lines("a.py,sha256=x,1\r\nb.py,,\r\n")
    assert parsed.text(["c.py,,"] + parsed.lines[1:]) == "c.py,,\r\nb.py,,\r\n"


def test_lines_are_made_and_indexed_with_csv_quoting():
    line = record.make_line("vllm/odd,name.py", b"x = 1\n")
    assert line.startswith('"vllm/odd,name.py",sha256=') and line.endswith(",6")
    lines = ["vllm/a.py,,", line, f"{record.make_line('vllm/RECORD', None)}"]
    assert record.index(lines) == {"vllm/a.py": 0, "vllm/odd,name.py": 1, "vllm/RECORD": 2}
    entry = record.entries(lines, ["vllm/odd,name.py"])["vllm/odd,name.py"][1]
    assert record.matches(entry, b"x = 1\n")
    assert not record.matches(entry, b"x = 2\n")
    assert record.line_of(entry) == line


def test_a_malformed_line_is_named_with_its_number():
    lines = ["vllm/a.py,sha256=abc,notasize", "vllm/b.py,,"]
    assert record.entry_of(lines[0]) is None
    assert isinstance(record.entry_of(lines[1]), RecordEntry)
    with pytest.raises(TargetError, match=r"site/RECORD line 1 is malformed"):
        record.entries(lines, where="site/RECORD")
    assert set(record.entries(lines, ["vllm/b.py"])) == {"vllm/b.py"}


def test_a_record_that_is_not_csv_is_refused():
    with pytest.raises(TargetError, match="not valid CSV"):
        record.index(["vllm/a.py,,", "vllm/b\r.py,sha256=x,1"])  # a bare CR inside an unquoted field
