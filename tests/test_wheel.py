"""Building a patched wheel, on small wheels made here (the real one: tests/integration)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from vllm_patch.artifacts.wheel import build_wheel, local_version, output_name, set_metadata_version
from vllm_patch.errors import DownloadError, InputError, PatchFailed, PinMismatch
from vllm_patch.series import load_series

METADATA = "Metadata-Version: 2.1\nName: vllm\nVersion: {v}\nSummary: x\n\nVersion: in the body stays\n"


def make_wheel(dest: Path, files: dict[str, bytes], version: str = "0.20.0",
               name: str | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / (name or f"vllm-{version}-cp38-abi3-linux_x86_64.whl")
    with WheelFile(path, "w") as wf:
        for rel, data in files.items():
            wf.writestr(rel, data)
        wf.writestr(f"vllm-{version}.dist-info/METADATA", METADATA.format(v=version))
        wf.writestr(f"vllm-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
    return path


def test_a_file_the_series_creates_gets_its_patch_mode(tmp_path, base_files, two_patch_series):
    first = sorted((two_patch_series / "patches").glob("0001-*.patch"))[0]
    text = first.read_bytes()
    assert b"new file mode 100644" in text
    first.write_bytes(text.replace(b"new file mode 100644", b"new file mode 100755"))
    series = load_series(two_patch_series)
    built = build_wheel(series, make_wheel(tmp_path / "in", base_files), tmp_path / "dist")
    with zipfile.ZipFile(built.path) as zf:
        assert zf.getinfo("vllm/new_kernel.py").external_attr >> 16 == 0o100755
        assert zf.getinfo("vllm/a.py").external_attr >> 16 == zipfile.ZipFile(
            tmp_path / "in" / "vllm-0.20.0-cp38-abi3-linux_x86_64.whl").getinfo("vllm/a.py").external_attr >> 16


def test_pure_helpers():
    assert local_version("0.20.0", "abc123") == "0.20.0+vp.abc123"
    assert output_name("vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl", "0.20.0+vp.ab") == \
        "vllm-0.20.0+vp.ab-cp38-abi3-manylinux_2_35_x86_64.whl"
    text = set_metadata_version(METADATA.format(v="0.20.0"), "0.20.0+vp.ab")
    assert "Version: 0.20.0+vp.ab\n" in text and "Version: in the body stays" in text
    with pytest.raises(InputError):
        set_metadata_version("Name: vllm\n\n", "1")


def test_builds_a_wheel_that_carries_the_series(tmp_path, base_files, two_patch_series):
    series = load_series(two_patch_series)
    source = make_wheel(tmp_path / "in", base_files)
    built = build_wheel(series, source, tmp_path / "dist")
    assert built.version == f"0.20.0+vp.{series.digest}"
    assert built.path.name == f"vllm-{built.version}-cp38-abi3-linux_x86_64.whl"
    assert built.changed == ["vllm/a.py", "vllm/b.py", "vllm/new_kernel.py"]
    assert built.notes and "not the pinned wheel" in built.notes[0]
    dist_info = f"vllm-{built.version}.dist-info"
    with WheelFile(built.path) as wf, zipfile.ZipFile(source) as up:
        for info in wf.infolist():  # reading through WheelFile checks every RECORD hash
            wf.read(info.filename)
        names = set(wf.namelist())
        assert f"{dist_info}/RECORD" in names and not any(n.startswith("vllm-0.20.0.dist-info") for n in names)
        assert f"Version: {built.version}" in wf.read(f"{dist_info}/METADATA").decode()
        assert wf.read("vllm/new_kernel.py") == b"KERNEL = 1\n"
        assert b"line 30b added" in wf.read("vllm/a.py")
        assert wf.read("vllm/dup.py") == up.read("vllm/dup.py")
        assert wf.getinfo("vllm/dup.py").CRC == up.getinfo("vllm/dup.py").CRC
        state = json.loads(wf.read(f"{dist_info}/vllm_patch.json"))
        assert [p["name"] for p in state["patches"]] == list(series.names)


def test_untouched_members_keep_their_compressed_bytes(tmp_path, base_files, two_patch_series):
    big = {"vllm/blob.bin": bytes(range(256)) * 4000, **base_files}
    source = make_wheel(tmp_path / "in", big)
    built = build_wheel(load_series(two_patch_series), source, tmp_path / "dist")
    with zipfile.ZipFile(source) as up, zipfile.ZipFile(built.path) as out:
        a, b = up.getinfo("vllm/blob.bin"), out.getinfo("vllm/blob.bin")
        assert (a.compress_size, a.CRC, a.compress_type) == (b.compress_size, b.CRC, b.compress_type)
        assert out.read("vllm/blob.bin") == big["vllm/blob.bin"]


def out_is_empty(path: Path) -> bool:
    return not path.exists() or not any(path.iterdir())


def test_pinned_name_with_other_bytes_is_refused(tmp_path, base_files, two_patch_series):
    series = load_series(two_patch_series)
    source = make_wheel(tmp_path / "in", base_files, name=series.pin.wheel.filename)
    with pytest.raises(DownloadError, match="does not match the pin"):
        build_wheel(series, source, tmp_path / "dist")
    assert out_is_empty(tmp_path / "dist")


def test_other_version_is_refused(tmp_path, base_files, two_patch_series):
    source = make_wheel(tmp_path / "in", base_files, version="0.21.0")
    with pytest.raises(PinMismatch, match="0.21.0"):
        build_wheel(load_series(two_patch_series), source, tmp_path / "dist")
    assert out_is_empty(tmp_path / "dist")


def rewritten(source: Path, folder: Path, edit) -> Path:
    """A copy of the wheel `source` in `folder`, each member's bytes passed through edit(name, data)."""
    folder.mkdir()
    copy = folder / source.name
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(copy, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, edit(info.filename, src.read(info.filename)))
    return copy


def test_corrupt_zip_is_refused(tmp_path, base_files, two_patch_series):
    source = make_wheel(tmp_path / "in", base_files)
    source.write_bytes(source.read_bytes()[:200])
    with pytest.raises(InputError, match="not a readable wheel|corrupt"):
        build_wheel(load_series(two_patch_series), source, tmp_path / "dist")
    assert out_is_empty(tmp_path / "dist")


def test_member_differing_from_its_record_is_refused(tmp_path, base_files, two_patch_series):
    source = make_wheel(tmp_path / "in", base_files)
    tampered = rewritten(source, tmp_path / "t",
                         lambda name, data: data.replace(b"return 1", b"return 9") if name == "vllm/b.py" else data)
    with pytest.raises(InputError, match="corrupt"):
        build_wheel(load_series(two_patch_series), tampered, tmp_path / "dist")
    assert out_is_empty(tmp_path / "dist")


def test_series_that_does_not_apply(tmp_path, base_files, two_patch_series):
    source = make_wheel(tmp_path / "in", {**base_files, "vllm/b.py": b"def f():\n    return 7\n"})
    with pytest.raises(PatchFailed, match="0001-first-fix.patch is conflict"):
        build_wheel(load_series(two_patch_series), source, tmp_path / "dist")
    assert out_is_empty(tmp_path / "dist")


def tampered_copy(source: Path, dest: Path, member: str) -> Path:
    """`source` with `member`'s bytes changed behind its RECORD's back."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(dest, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info, data + b"# tampered\n" if info.filename == member else data)
    return dest


def test_untouched_member_differing_from_its_record_is_refused(tmp_path, base_files, two_patch_series):
    """A wheel other than the pinned one has every member checked against its RECORD before any write,
    not only the members the series touches (the untouched ones are copied raw)."""
    source = make_wheel(tmp_path / "in", base_files)
    tampered = tampered_copy(source, tmp_path / "t" / source.name, "vllm/dup.py")
    with pytest.raises(InputError, match=r"corrupt wheel: .*vllm/dup\.py didn't match RECORD"):
        build_wheel(load_series(two_patch_series), tampered, tmp_path / "dist")
    assert out_is_empty(tmp_path / "dist")


def test_the_new_record_validates_with_installer(tmp_path, base_files, two_patch_series):
    from installer.sources import WheelFile as SourceWheel
    big = {"vllm/blob.bin": bytes(range(256)) * 4000, **base_files}
    built = build_wheel(load_series(two_patch_series), make_wheel(tmp_path / "in", big), tmp_path / "dist")
    with SourceWheel.open(built.path) as wheel:
        wheel.validate_record(validate_contents=True)
        assert wheel.dist_info_dir == f"vllm-{built.version}.dist-info"
        lines = wheel.read_dist_info("RECORD").splitlines()
    assert lines[-1] == f"vllm-{built.version}.dist-info/RECORD,,"
    assert len(lines) == len(set(lines))


def unpack(wheel: Path, dest: Path) -> Path:
    """What pip leaves in site-packages, short of bytecode: the members as they are."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    return dest


def test_apply_on_an_installed_patched_wheel_changes_nothing(tmp_path, base_files, two_patch_series):
    from helpers import snapshot
    from vllm_patch import operations
    from vllm_patch.targets import SitePackagesTarget

    series = load_series(two_patch_series)
    built = build_wheel(series, make_wheel(tmp_path / "in", base_files), tmp_path / "dist")
    site = unpack(built.path, tmp_path / "site")
    before = snapshot(site)
    outcome = operations.apply(SitePackagesTarget(site), series)
    assert outcome.ok and outcome.changed == [] and outcome.verdict == "applied"
    assert snapshot(site) == before
    status = operations.status(SitePackagesTarget(site), series, full=True)
    assert status.ok and status.integrity == [] and status.verdict == "applied"
    # And the record it carries is the one a site-packages apply writes: revert restores the upstream files.
    assert operations.revert(SitePackagesTarget(site), series).ok
    for rel in ("vllm/a.py", "vllm/b.py"):
        assert (site / rel).read_bytes() == base_files[rel]
    assert not (site / "vllm/new_kernel.py").exists()
    assert SitePackagesTarget(site).integrity([], full=True) == []


def _flag_encrypted(path: Path, member: str) -> None:
    """Set the 'encrypted' flag bit of `member` in its local header and central directory entry,
    as a zip tool that encrypts it would (the data stays as it was: the flag alone must be refused)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
        central = zf.start_dir
    local = info.header_offset
    assert data[local:local + 4] == b"PK\x03\x04"
    data[local + 6] |= 0x01
    name = member.encode()
    entry = data.index(b"PK\x01\x02", central)
    while data[entry + 46:entry + 46 + len(name)] != name:
        entry = data.index(b"PK\x01\x02", entry + 4)
    data[entry + 8] |= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("member", ["vllm/c.py", "vllm/b.py"], ids=["untouched", "patched"])
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_encrypted_member_is_refused(tmp_path, base_files, two_patch_series, member, pinned):
    source = make_wheel(tmp_path / "in", {**base_files, "vllm/c.py": b"X = 1\n"})
    _flag_encrypted(source, member)
    with zipfile.ZipFile(source) as zf:
        assert zf.getinfo(member).flag_bits & 0x01
    series = load_series(two_patch_series)
    if pinned:  # the pin names this very file: its members are copied without reading them
        series = replace(series, pin=replace(series.pin, wheel=replace(
            series.pin.wheel, filename=source.name, sha256=hashlib.sha256(source.read_bytes()).hexdigest())))
    with pytest.raises(InputError, match=f"{member}.* encrypted"):
        build_wheel(series, source, tmp_path / "dist")
    assert out_is_empty(tmp_path / "dist")


@pytest.mark.parametrize("member", ["../../evil", "vllm/../../evil.py", "/etc/evil", "vllm\\evil.py", "C:/evil",
                                    "vllm//evil.py", "./vllm/evil.py"])
def test_unsafe_member_name_is_refused(tmp_path, base_files, two_patch_series, member):
    """A member that would land outside site-packages (or lands elsewhere on another OS) is refused,
    as pypa/installer refuses it, before anything is written."""
    source = make_wheel(tmp_path / "in", {**base_files, member: b"EVIL = 1\n"})
    with zipfile.ZipFile(source) as zf:
        assert member in zf.namelist() and member in zf.read("vllm-0.20.0.dist-info/RECORD").decode()
    with pytest.raises(InputError, match="unsafe member name") as caught:
        build_wheel(load_series(two_patch_series), source, tmp_path / "dist")
    assert repr(member) in caught.value.message and "\n" not in caught.value.message
    assert out_is_empty(tmp_path / "dist")


def test_unsafe_name_only_in_record_is_refused(tmp_path, base_files, two_patch_series):
    source = make_wheel(tmp_path / "in", base_files)
    tampered = rewritten(source, tmp_path / "t",
                         lambda name, data: data + b"../../evil,,\n" if name.endswith("/RECORD") else data)
    with pytest.raises(InputError, match="unsafe member name '../../evil'"):
        build_wheel(load_series(two_patch_series), tampered, tmp_path / "dist")
    assert out_is_empty(tmp_path / "dist")
