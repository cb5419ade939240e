"""Build a patched vLLM wheel from the pinned upstream wheel.

The series is applied to the wheel's members in memory; the result gets a PEP 440
local version naming the series (``0.20.0+vp.<digest>``), a renamed dist-info, an
updated METADATA, a regenerated RECORD and the applied patches' record. Members the
series does not touch are copied byte for byte, compressed data included.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version
from wheel.wheelfile import WheelError, WheelFile

from . import __version__, record
from .engine import Analysis, analyze, touched
from .errors import DownloadError, InputError, PatchFailed, PinMismatch
from .rawzip import can_copy_raw, copy_raw
from .series import Series
from .targets.site_packages import STATE_FILE
from .upstream import file_sha256


@dataclass
class BuiltWheel:
    path: Path
    version: str
    changed: list[str]
    analysis: Analysis
    notes: list[str]


def local_version(pin_version: str, digest: str) -> str:
    return f"{Version(pin_version).public}+vp.{digest}"


def set_metadata_version(text: str, version: str) -> str:
    """METADATA with its ``Version:`` header replaced (the body is left alone)."""
    head, sep, body = text.partition("\n\n")
    lines = head.split("\n")
    hits = [i for i, line in enumerate(lines) if line.startswith("Version:")]
    if len(hits) != 1:
        raise InputError("the wheel's METADATA has no single 'Version:' header")
    lines[hits[0]] = f"Version: {version}"
    return "\n".join(lines) + sep + body


def output_name(source_name: str, version: str) -> str:
    """The source wheel's file name with the new version, tags kept."""
    name, old, _, _ = parse_wheel_filename(source_name)
    stem = source_name[: -len(".whl")]
    tags = stem.split("-", 2)[2]
    return f"{name.replace('-', '_')}-{version}-{tags}.whl"


def state_text(series: Series, originals: dict[str, str | None]) -> str:
    return json.dumps({
        "tool": f"vllm-patch {__version__}",
        "patches": [{"name": p.name, "sha256": p.sha256, "text": p.raw.decode("utf-8")} for p in series.patches],
        "record": originals,
    }, indent=1, sort_keys=True) + "\n"


def _hash_pair(line: str) -> tuple[str, str] | None:
    entry = record.entry_of(line)
    if entry is None or entry.hash_ is None:
        return None
    return entry.hash_.name, entry.hash_.value


def verify_source(series: Series, source: Path, verified: bool = False) -> list[str]:
    """Refuse a wheel that is not the pinned one; notes for an unpinned platform."""
    pin = series.pin
    try:
        _, version, _, _ = parse_wheel_filename(source.name)
    except InvalidWheelFilename as exc:
        raise InputError(f"{source.name}: not a wheel file name ({exc})") from None
    if not pin.matches_version(str(version)):
        raise PinMismatch(f"{source.name} is vLLM {version}, the series is pinned to {pin.version}; "
                          "rebase the series onto it first")
    if source.name == pin.wheel.filename:
        if verified:
            return []
        digest = file_sha256(source)
        if digest != pin.wheel.sha256:
            raise DownloadError(f"{source.name}: sha256 {digest} does not match the pin {pin.wheel.sha256}")
        return []
    return [f"{source.name} is not the pinned wheel ({pin.wheel.filename}); its contents are checked "
            "against its own RECORD only"]


def build_wheel(series: Series, source: Path, out_dir: Path, verified: bool = False) -> BuiltWheel:
    """Write the patched wheel into `out_dir`; nothing is written there on any error.
    `verified`: the caller has just checked the source's sha256 against the pin."""
    notes = verify_source(series, source, verified)
    version = local_version(series.pin.version, series.digest)
    name = output_name(source.name, version)
    try:
        src = WheelFile(source)
    except (zipfile.BadZipFile, WheelError, OSError) as exc:
        raise InputError(f"{source.name}: not a readable wheel ({exc})") from None
    with src:
        dist_info = src.dist_info_path
        names = set(src.namelist())
        try:
            meta = src.read(f"{dist_info}/METADATA").decode("utf-8")
            record_text = src.read(src.record_path).decode("utf-8")
            paths = touched(list(series.patches))
            contents = {p: src.read(p) if p in names else None for p in paths}
        except (zipfile.BadZipFile, WheelError, KeyError, OSError) as exc:
            raise InputError(f"{source.name}: corrupt wheel ({exc})") from None
        found = next((line.split(":", 1)[1].strip() for line in meta.split("\n") if line.startswith("Version:")), "")
        name_field = next((line.split(":", 1)[1].strip() for line in meta.split("\n") if line.startswith("Name:")), "")
        if canonicalize_name(name_field) != "vllm" or not series.pin.matches_version(found):
            raise PinMismatch(f"{source.name}: its METADATA says {name_field} {found}, the series is pinned "
                              f"to vllm {series.pin.version}")
        analysis = analyze(list(series.patches), contents)
        if not analysis.consistent or analysis.applied:
            bad = [f"{r.name} is {r.state.value}" for r in analysis.reports if r.state.value != "applies"]
            raise PatchFailed(f"the series does not apply to {source.name}: {'; '.join(bad)}")
        new_files = {p: d for p, d in analysis.patched.items() if d != contents.get(p)}
        lines = record.parse_lines(record_text).lines
        at = record.index(lines)
        originals = {p: (lines[at[p]] if p in at else None) for p in new_files}
        new_dist_info = f"{name.split('-')[0]}-{version}.dist-info"
        out_dir.mkdir(parents=True, exist_ok=True)
        # WheelFile takes its dist-info and RECORD names from the file name: build under
        # the final name in a private directory, then rename it into place.
        tmp_dir = Path(tempfile.mkdtemp(prefix=".build-", dir=out_dir))
        final = out_dir / name
        try:
            _write(src, tmp_dir / name, dist_info, new_dist_info, set_metadata_version(meta, version),
                   new_files, lines, at, state_text(series, originals) if series.patches else None)
            os.replace(tmp_dir / name, final)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return BuiltWheel(final, version, sorted(new_files), analysis, notes)


def _write(src: WheelFile, path: Path, dist_info: str, new_dist_info: str, metadata: str,
           new_files: dict[str, bytes | None], lines: list[str], at: dict[str, int], state: str | None) -> None:
    new_files = dict(new_files)
    with WheelFile(path, "w") as dst:
        assert dst.dist_info_path == new_dist_info, dst.dist_info_path
        for info in src.infolist():
            member = info.filename
            if member == src.record_path or member.endswith("/"):
                continue
            if member in new_files:
                data = new_files.pop(member)
                if data is not None:
                    dst.writestr(_like(info, member), data)
                continue
            if member.startswith(dist_info + "/"):
                renamed = new_dist_info + member[len(dist_info):]
                data = metadata.encode() if member == f"{dist_info}/METADATA" else src.read(member)
                dst.writestr(_like(info, renamed), data)
                continue
            pair = _hash_pair(lines[at[member]]) if member in at else None
            if pair is None or not can_copy_raw(info):
                dst.writestr(_like(info, member), src.read(member))
                continue
            copy_raw(src, info, dst)
            dst._file_hashes[member] = pair
            dst._file_sizes[member] = info.file_size
        created = {**new_files, f"{new_dist_info}/{STATE_FILE}": state.encode() if state is not None else None}
        for member, data in created.items():
            if data is not None:
                dst.writestr(_like(NEW_MEMBER, member), data)


NEW_MEMBER = zipfile.ZipInfo("new", date_time=(2026, 1, 1, 0, 0, 0))
NEW_MEMBER.external_attr = 0o100644 << 16


def _like(info: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    """A member named `name` with `info`'s date and mode, deflated."""
    zi = zipfile.ZipInfo(name, date_time=info.date_time)
    zi.external_attr = info.external_attr
    zi.compress_type = zipfile.ZIP_DEFLATED
    return zi
