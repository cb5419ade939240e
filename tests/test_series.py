from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import PIN_LINES
from vllm_patch.engine.pin import pin_from_fields, pin_lines
from vllm_patch.errors import InputError
from vllm_patch.infrastructure import readfile
from vllm_patch.series import load_series, parse_series_text


def test_series_text_pin_and_names():
    fields, names = parse_series_text("# c\n" + PIN_LINES + "\n0001-a.patch\n  0002-b.patch\n# x.patch\n")
    assert names == ["0001-a.patch", "0002-b.patch"]
    pin = pin_from_fields(fields)
    assert pin.version == "0.20.0" and pin.tag == "v0.20.0"
    assert pin.sdist.sha256.startswith("a6d50152") and pin.wheel.filename.endswith(".whl")


def test_pin_matching_rules():
    pin = pin_from_fields(parse_series_text(PIN_LINES)[0])
    assert pin.matches_version("0.20.0") and pin.matches_version("0.20.0+vp.abc123")
    assert not pin.matches_version("0.21.0") and not pin.matches_version("garbage")
    assert pin.matches_commit("gb8160878f") and pin.matches_commit("b8160878f07fe6aff02deb12bc842df3fa4a9237")
    assert not pin.matches_commit("g1234567") and not pin.matches_commit("b81")


@pytest.mark.parametrize(("text", "message"), [
    (PIN_LINES + "a.patch\na.patch\n", "listed twice"),
    (PIN_LINES + "a.patch -p1\n", "options"),
    (PIN_LINES + "../x.patch\n", "unsafe"),
    (PIN_LINES + "#: color = red\n", "KEY"),
    (PIN_LINES + "#: tag = v1\n", "twice"),
])
def test_bad_series_text(text, message):
    with pytest.raises(InputError, match=message):
        pin_from_fields(parse_series_text(text)[0])


def test_pin_missing_fields():
    with pytest.raises(InputError, match="lacks"):
        pin_from_fields(parse_series_text("#: version = 0.20.0\n")[0])
    bad = PIN_LINES.replace("sha256:a6d5", "sha256:zzzz")
    with pytest.raises(InputError, match="sha256"):
        pin_from_fields(parse_series_text(bad)[0])


def test_series_naming_a_missing_file(tmp_path: Path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "series").write_text(PIN_LINES + "0001-gone.patch\n")
    with pytest.raises(InputError, match="does not exist"):
        load_series(tmp_path)


def test_missing_series_file(tmp_path: Path):
    with pytest.raises(InputError, match="no series file"):
        load_series(tmp_path)


def test_loads_a_real_format_patch_series(two_patch_series: Path):
    series = load_series(two_patch_series)
    assert series.names == ("0001-first-fix.patch", "0002-second-fix.patch")
    assert series.touched_paths() == ("vllm/a.py", "vllm/b.py", "vllm/new_kernel.py")
    assert series.patches[0].trailer("Origin") == "vendor"
    assert len(series.digest) == 12


@pytest.mark.parametrize("which", ["series", "patch"])
def test_a_series_or_patch_that_is_a_device_is_refused_unread(two_patch_series: Path, which: str):
    """A symlink to /dev/zero would be read without end: it is refused, naming the file."""
    path = two_patch_series / "series" if which == "series" else two_patch_series / "patches/0001-first-fix.patch"
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(InputError, match=rf"^{path} is not a regular file"):
        load_series(two_patch_series)


def test_a_series_that_is_a_fifo_is_refused_unread(two_patch_series: Path):
    path = two_patch_series / "series"
    path.unlink()
    os.mkfifo(path)  # opening it would block until a writer came
    with pytest.raises(InputError, match="is not a regular file"):
        load_series(two_patch_series)


def test_an_oversized_patch_is_refused(two_patch_series: Path, monkeypatch):
    monkeypatch.setattr(readfile, "PATCH_LIMIT", 1024)
    path = two_patch_series / "patches/0001-first-fix.patch"
    path.write_bytes(path.read_bytes() + b" " * 2048)
    with pytest.raises(InputError, match=rf"^{path} is larger than 1 KiB"):
        load_series(two_patch_series)


def test_pin_declares_the_later_releases_it_is_proven_on():
    pin = pin_from_fields(parse_series_text(PIN_LINES + "#: also = 0.20.1 0.20.2\n")[0])
    assert pin.also == ("0.20.1", "0.20.2") and pin.releases == ("0.20.0", "0.20.1", "0.20.2")
    assert pin.covers("0.20.2") and pin.covers("0.20.1+vp.abc") and pin.covers("0.20.0")
    assert not pin.covers("0.20.3") and not pin.covers("garbage")
    assert not pin.matches_version("0.20.1")  # the pin itself (its wheel, its commit) stays 0.20.0
    assert pin_from_fields(parse_series_text("\n".join(pin_lines(pin)) + "\n")[0]) == pin
    assert pin_from_fields(parse_series_text(PIN_LINES)[0]).also == ()


@pytest.mark.parametrize(("also", "message"), [
    ("0.20.1 0.20.1", "twice"), ("0.20.0", "twice"), ("0.20.x", "not a valid version")])
def test_bad_also_releases(also, message):
    with pytest.raises(InputError, match=message):
        pin_from_fields(parse_series_text(PIN_LINES + f"#: also = {also}\n")[0])


def test_errors_name_the_series_file(tmp_path: Path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "series").write_text(PIN_LINES + "#: color = red\n")
    with pytest.raises(InputError, match=rf"^{tmp_path / 'series'} line \d+: expected"):
        load_series(tmp_path)
    (tmp_path / "series").write_text("#: version = 0.20.0\n")
    with pytest.raises(InputError, match=rf"^{tmp_path / 'series'}: the pin lacks"):
        load_series(tmp_path)


def test_a_malformed_patch_is_named_by_its_path(two_patch_series: Path):
    path = two_patch_series / "patches/0001-first-fix.patch"
    path.write_bytes(path.read_bytes().replace(b"\n@@ ", b"\n@@ garbage ", 1))
    with pytest.raises(InputError, match=rf"^{path}: "):
        load_series(two_patch_series)
