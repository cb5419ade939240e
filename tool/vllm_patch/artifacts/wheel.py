"""Build a patched vLLM wheel from the pinned upstream wheel.

The series is applied to the wheel's members in memory; the result gets a PEP 440
local version naming the series (``0.20.0+vp.<digest>``), a renamed dist-info, an
updated METADATA, a regenerated RECORD and the applied patches' record. Members the
series does not touch are copied byte for byte, compressed data included, with the
hash the source RECORD gives them: so a source other than the sha256-pinned wheel has
every member checked against its own RECORD (pypa/installer) before anything is written.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from installer.records import RecordEntry
from installer.sources import WheelFile as SourceWheel
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..engine import record
from ..engine.analysis import Analysis, analyze, created_modes, touched
from ..engine.state import STATE_FILE, AppliedState
from ..errors import DownloadError, InputError, PatchFailed, PinMismatch
from ..infrastructure.downloads import file_sha256
from ..series import Series
from .publish import publish
from .rawzip import can_copy_raw, copy_raw, encrypted_members

# Members a source wheel may carry that cannot survive a rewrite: signatures of the old RECORD.
SIGNATURES = ("RECORD.jws", "RECORD.p7s")

@dataclass
class BuiltWheel:
    path: Path
    version: str
    changed: list[str]
    analysis: Analysis
    notes: list[str]


def local_version(pin_version: str, digest: str) -> str:
    """The patched wheel's version: the release's, with the series digest as a PEP 440 local label."""
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


def wheel_release(source: Path) -> str:
    """The vLLM release a wheel file carries, as its file name says (checked against its METADATA
    when it is built)."""
    try:
        _, version, _, _ = parse_wheel_filename(source.name)
    except InvalidWheelFilename as exc:
        raise InputError(f"{source.name}: not a wheel file name ({exc})") from None
    return str(version)


def verify_source(series: Series, source: Path, verified: bool = False) -> list[str]:
    """Refuse a wheel of a release the series is not proven on (its pin or a declared ``also``);
    notes for a wheel that is not the pinned file."""
    pin = series.pin
    version = wheel_release(source)
    if not pin.covers(version):
        raise PinMismatch(f"{source.name} is vLLM {version}, the series is proven on vLLM "
                          f"{', '.join(pin.releases)}; rebase the series onto it first")
    if source.name == pin.wheel.filename:
        if verified:
            return []
        digest = file_sha256(source)
        if digest != pin.wheel.sha256:
            raise DownloadError(f"{source.name}: sha256 {digest} does not match the pin {pin.wheel.sha256}")
        return []
    return [f"{source.name} is not the pinned wheel ({pin.wheel.filename}); its contents are checked "
            "against its own RECORD only"]


def _same_public(a: str, b: str) -> bool:
    try:
        return Version(a).public == Version(b).public
    except InvalidVersion:
        return False


RE_DRIVE = re.compile(r"^[A-Za-z]:")


def unsafe_member(name: str) -> bool:
    """Whether an archive member name could land outside the install directory, or somewhere else
    on another OS: absolute, a drive letter, a backslash, or a '..', '.' or empty part (pypa/installer
    refuses a path leaving its target; a patched wheel must install wherever the release does)."""
    parts = name[:-1].split("/") if name.endswith("/") else name.split("/")
    return (not name or name.startswith("/") or "\\" in name or "\0" in name or RE_DRIVE.match(name) is not None
            or any(part in ("", ".", "..") for part in parts))


def _refuse_unsafe(source: Path, names: list[str]) -> None:
    bad = [n for n in names if unsafe_member(n)]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(f"{source.name}: unsafe member name {bad[0]!r}{more} (absolute, '..', '.', an empty part, "
                         "a backslash or a drive letter); nothing was written")


def _read_source(source: Path, zf: zipfile.ZipFile, check_contents: bool) -> tuple[str, list[str]]:
    """The source's dist-info directory and RECORD lines, once pypa/installer has checked that
    RECORD lists every member (and, with `check_contents`, that every member has its hash and size)."""
    try:
        wheel = SourceWheel(zf)
        wheel.validate_record(validate_contents=check_contents)
        dist_info = wheel.dist_info_dir
    except ValueError as exc:  # installer's validation errors are ValueErrors carrying `issues`
        issues = [str(i).replace(f"In {zf.filename}, ", "") for i in getattr(exc, "issues", None) or [exc]]
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        raise InputError(f"{source.name}: corrupt wheel: {issues[0]}{more}; nothing was written") from None
    text = zf.read(f"{dist_info}/RECORD").decode("utf-8")
    return dist_info, record.parse_lines(text).lines


def build_wheel(series: Series, source: Path, out_dir: Path, verified: bool = False, wait: float = 30.0,
                on_wait: Callable[[], None] | None = None) -> BuiltWheel:
    """Write the patched wheel into `out_dir`; nothing is written there on any error.
    `verified`: the caller has just checked the source's sha256 against the pin. `wait`: seconds
    to wait for another run writing into `out_dir`."""
    notes = verify_source(series, source, verified)
    pinned = source.name == series.pin.wheel.filename  # its sha256 is checked: no need to hash every member
    # The wheel's own release (the pin or one the line declares), labelled with the series.
    version = local_version(wheel_release(source), series.digest)
    name = output_name(source.name, version)
    try:
        src = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"{source.name}: not a readable wheel ({exc})") from None
    try:
        with src:
            return _build(series, source, src, out_dir, name, version, notes, pinned, wait, on_wait)
    except (zipfile.BadZipFile, zlib.error, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"{source.name}: corrupt wheel ({type(exc).__name__}: {exc}); nothing was written") \
            from None


def _build(series: Series, source: Path, src: zipfile.ZipFile, out_dir: Path, name: str, version: str,
           notes: list[str], pinned: bool, wait: float, on_wait: Callable[[], None] | None) -> BuiltWheel:
    encrypted = encrypted_members(src)
    if encrypted:
        more = f" (and {len(encrypted) - 1} more)" if len(encrypted) > 1 else ""
        raise InputError(f"{source.name}: member {encrypted[0]}{more} is encrypted, which no wheel may be; "
                         "nothing was written")
    _refuse_unsafe(source, src.namelist())
    dist_info, lines = _read_source(source, src, check_contents=not pinned)
    _refuse_unsafe(source, list(record.index(lines)))
    names = set(src.namelist())
    try:
        meta = src.read(f"{dist_info}/METADATA").decode("utf-8")
    except KeyError:
        raise InputError(f"{source.name}: corrupt wheel (no {dist_info}/METADATA)") from None
    paths = touched(list(series.patches))
    contents = {p: src.read(p) if p in names else None for p in paths}
    found = next((line.split(":", 1)[1].strip() for line in meta.split("\n") if line.startswith("Version:")), "")
    name_field = next((line.split(":", 1)[1].strip() for line in meta.split("\n") if line.startswith("Name:")), "")
    release = wheel_release(source)
    if canonicalize_name(name_field) != "vllm" or not _same_public(found, release) or not series.pin.covers(found):
        raise PinMismatch(f"{source.name}: its METADATA says {name_field} {found}, the file name "
                          f"{release}; the series is proven on vllm {', '.join(series.pin.releases)}")
    analysis = analyze(list(series.patches), contents)
    if not analysis.consistent or analysis.applied:
        bad = [f"{r.name} is {r.state.value}" for r in analysis.reports if r.state.value != "applies"]
        raise PatchFailed(f"the series does not apply to {source.name}: {'; '.join(bad)}")
    new_files = {p: d for p, d in analysis.patched.items() if d != contents.get(p)}
    at = record.index(lines)
    originals = {p: (lines[at[p]] if p in at else None) for p in new_files}
    new_dist_info = f"{name.split('-')[0]}-{version}.dist-info"
    written = {p: record.record_hash(d) for p, d in new_files.items() if d is not None}
    state = AppliedState.of(list(series.patches), originals, written=written).dump() if series.patches else None
    # Written under a hidden partial name, renamed into place: no cut-off file is ever named like a wheel.
    swept = publish(out_dir, name, lambda path: _write(
        src, path, dist_info, new_dist_info, set_metadata_version(meta, version), new_files, lines, at, state,
        created_modes(list(series.patches))), wait, on_wait)
    if swept:
        notes.append(f"removed what an interrupted run left in {out_dir}: {', '.join(swept)}")
    return BuiltWheel(out_dir / name, version, sorted(new_files), analysis, notes)


def _write(src: zipfile.ZipFile, path: Path, dist_info: str, new_dist_info: str, metadata: str,
           new_files: dict[str, bytes | None], lines: list[str], at: dict[str, int], state: bytes | None,
           modes: dict[str, int]) -> None:
    """Write the new wheel and its RECORD (one line per member, written with installer's RecordEntry).
    A file the series creates gets the mode its patch gives it (``new file mode``), as on a target."""
    new_files = dict(new_files)
    rows: list[str] = []
    with zipfile.ZipFile(path, "w") as dst:
        def put(info: zipfile.ZipInfo, member: str, data: bytes) -> None:
            dst.writestr(_like(info, member), data)
            rows.append(record.make_line(member, data))

        for info in src.infolist():
            member = info.filename
            if member.endswith("/") or member == f"{dist_info}/RECORD" or \
                    member in (f"{dist_info}/{sig}" for sig in SIGNATURES):
                continue
            if member in new_files:
                data = new_files.pop(member)
                if data is not None:
                    put(info, member, data)
                continue
            if member.startswith(dist_info + "/"):
                renamed = new_dist_info + member[len(dist_info):]
                put(info, renamed, metadata.encode() if member == f"{dist_info}/METADATA" else src.read(member))
                continue
            entry = record.entry_at(lines, at[member], f"{dist_info}/RECORD") if member in at else None
            if entry is None or entry.hash_ is None or entry.size is None or not can_copy_raw(info):
                put(info, member, src.read(member))
                continue
            copy_raw(src, info, dst)
            rows.append(record.line_of(RecordEntry(member, entry.hash_, entry.size)))
        created = {**new_files, f"{new_dist_info}/{STATE_FILE}": state}
        for member, data in created.items():
            if data is not None:
                put(_new_member(modes.get(member, 0o644)), member, data)
        rows.append(record.make_line(f"{new_dist_info}/RECORD", None))
        dst.writestr(_like(_new_member(0o644), f"{new_dist_info}/RECORD"), "".join(row + "\n" for row in rows))


def _new_member(mode: int) -> zipfile.ZipInfo:
    """A template for a member the source lacks: a fixed date (reproducible wheels), a regular file."""
    info = zipfile.ZipInfo("new", date_time=(2026, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16
    return info


def _like(info: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    """A member named `name` with `info`'s date and mode, deflated."""
    zi = zipfile.ZipInfo(name, date_time=info.date_time)
    zi.external_attr = info.external_attr
    zi.compress_type = zipfile.ZIP_DEFLATED
    return zi
