"""Bounded reads of the project's input files."""

from __future__ import annotations

import pytest

from vllm_patch.errors import InputError
from vllm_patch.infrastructure.readfile import read_regular


def test_reads_a_regular_file_up_to_the_limit(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_regular(path, 10) == b"x" * 10
    with pytest.raises(InputError, match="larger than"):
        read_regular(path, 9)


def test_missing_file_is_left_to_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "gone", 10)


def test_devices_and_directories_are_refused(tmp_path):
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    for path in (link, tmp_path):
        with pytest.raises(InputError, match="is not a regular file"):
            read_regular(path, 1 << 20)
