from __future__ import annotations

import json

import pytest

from helpers import make_site_packages, snapshot
from vllm_patch import operations
from vllm_patch.errors import PinMismatch, TargetError
from vllm_patch.series import load_series
from vllm_patch.targets import SitePackagesTarget, open_target
from vllm_patch.targets.site_packages import STATE_FILE


@pytest.fixture
def site(tmp_path, base_files):
    root = make_site_packages(tmp_path / "site", base_files)
    cache = root / "vllm/__pycache__"
    cache.mkdir()
    (cache / "a.cpython-311.pyc").write_bytes(b"stale bytecode")
    (cache / "dup.cpython-311.pyc").write_bytes(b"other module")
    return root


def test_detected_from_path(site):
    assert isinstance(open_target(str(site)), SitePackagesTarget)


def test_apply_rewrites_record_drops_stale_bytecode_and_records_state(site, two_patch_series):
    series = load_series(two_patch_series)
    target = SitePackagesTarget(site)
    out = operations.apply(target, series)
    assert out.ok
    assert not (site / "vllm/__pycache__/a.cpython-311.pyc").exists()
    assert (site / "vllm/__pycache__/dup.cpython-311.pyc").exists()
    assert target.integrity(["vllm/a.py"], full=True) == []
    record = (site / "vllm-0.20.0.dist-info/RECORD").read_text()
    assert "vllm/new_kernel.py,sha256=" in record
    assert f"vllm-0.20.0.dist-info/{STATE_FILE},," in record
    state = json.loads((site / f"vllm-0.20.0.dist-info/{STATE_FILE}").read_text())
    assert [p["name"] for p in state["patches"]] == list(series.names)
    assert operations.status(SitePackagesTarget(site), series).verdict == "applied"


def test_round_trip_restores_every_byte_and_record(site, two_patch_series):
    series = load_series(two_patch_series)
    before = {k: v for k, v in snapshot(site).items() if not k.endswith(".pyc")}
    operations.apply(SitePackagesTarget(site), series)
    operations.revert(SitePackagesTarget(site), series)
    after = {k: v for k, v in snapshot(site).items() if not k.endswith(".pyc")}
    assert after == before
    assert SitePackagesTarget(site).integrity([], full=True) == []


def test_revert_uses_the_recorded_patches_after_the_series_changed(site, two_patch_series, tmp_path, base_files):
    from helpers import build_series, edit
    before = {k: v for k, v in snapshot(site).items() if not k.endswith(".pyc")}
    operations.apply(SitePackagesTarget(site), load_series(two_patch_series))
    b2 = edit(base_files["vllm/b.py"], b"return 2\n", b"return 22\n")
    newer = load_series(build_series(tmp_path / "newer", base_files, [("other fix", {"vllm/b.py": b2})]))
    status = operations.status(SitePackagesTarget(site), newer)
    assert any("another version of the series" in n for n in status.notes)
    upgraded = operations.apply(SitePackagesTarget(site), newer)
    assert upgraded.ok and (site / "vllm/b.py").read_bytes() == b2
    assert not (site / "vllm/new_kernel.py").exists()
    assert SitePackagesTarget(site).integrity([], full=True) == []
    operations.revert(SitePackagesTarget(site), load_series(two_patch_series))
    after = {k: v for k, v in snapshot(site).items() if not k.endswith(".pyc")}
    assert after == before


def test_crlf_record_as_pip_writes_it_survives_a_round_trip(tmp_path, base_files, two_patch_series):
    site = make_site_packages(tmp_path / "crlf", base_files, newline="\r\n")
    record = site / "vllm-0.20.0.dist-info/RECORD"
    before = record.read_bytes()
    operations.apply(SitePackagesTarget(site), load_series(two_patch_series))
    assert b"vllm/new_kernel.py,sha256=" in record.read_bytes() and b"\r\n" in record.read_bytes()
    assert b"\n" not in record.read_bytes().replace(b"\r\n", b"")
    operations.revert(SitePackagesTarget(site), load_series(two_patch_series))
    assert record.read_bytes() == before


def test_file_edited_by_another_tool_is_refused(site, two_patch_series):
    (site / "vllm/b.py").write_bytes((site / "vllm/b.py").read_bytes() + b"# monkey\n")
    before = snapshot(site)
    with pytest.raises(TargetError, match="differs from .*RECORD"):
        operations.apply(SitePackagesTarget(site), load_series(two_patch_series))
    assert snapshot(site) == before


def test_every_file_unlike_its_record_is_named_at_once(site, two_patch_series):
    for rel in ("vllm/a.py", "vllm/b.py"):
        (site / rel).write_bytes((site / rel).read_bytes() + b"# monkey\n")
    (site / "vllm/new_kernel.py").write_bytes(b"KERNEL = 1\n")
    before = snapshot(site)
    with pytest.raises(TargetError) as raised:
        operations.apply(SitePackagesTarget(site), load_series(two_patch_series))
    assert "vllm/a.py, vllm/b.py differ from" in raised.value.message
    assert "vllm/new_kernel.py exists but not in" in raised.value.message
    assert snapshot(site) == before


def test_unrecorded_file_in_the_way_is_refused(site, two_patch_series):
    (site / "vllm/new_kernel.py").write_bytes(b"KERNEL = 1\n")
    with pytest.raises(TargetError, match="not in .*RECORD"):
        operations.apply(SitePackagesTarget(site), load_series(two_patch_series))


def test_other_vllm_version_is_refused(tmp_path, base_files, two_patch_series):
    site = make_site_packages(tmp_path / "s21", base_files, version="0.21.0")
    before = snapshot(site)
    with pytest.raises(PinMismatch, match="version 0.21.0"):
        operations.apply(SitePackagesTarget(site), load_series(two_patch_series))
    assert snapshot(site) == before


def test_missing_distribution(tmp_path):
    with pytest.raises(TargetError, match="no vllm-"):
        SitePackagesTarget(tmp_path)


def test_running_interpreter_without_vllm_is_a_clear_error(two_patch_series):
    from click.testing import CliRunner

    from vllm_patch.cli import main
    result = CliRunner().invoke(main, ["--series", str(two_patch_series), "status", "--target", "site-packages"])
    assert result.exit_code == 2 and "no vLLM distribution is installed for" in result.stderr


def test_revert_refuses_when_it_would_not_restore_the_recorded_bytes(site, two_patch_series):
    series = load_series(two_patch_series)
    operations.apply(SitePackagesTarget(site), series)
    state_file = site / f"vllm-0.20.0.dist-info/{STATE_FILE}"
    state = json.loads(state_file.read_text())
    line = state["record"]["vllm/b.py"]
    state["record"]["vllm/b.py"] = line.replace("sha256=", "sha256=AAAA", 1)
    state_file.write_text(json.dumps(state))
    before = snapshot(site)
    with pytest.raises(TargetError, match="would not restore the original vllm/b.py"):
        operations.revert(SitePackagesTarget(site), series)
    assert snapshot(site) == before


def test_record_line_of_a_deleted_file_returns_to_its_place(tmp_path, base_files):
    from helpers import build_series
    site = make_site_packages(tmp_path / "del", base_files)
    record = site / "vllm-0.20.0.dist-info/RECORD"
    record.write_bytes(record.read_bytes().rstrip(b"\n"))  # and no final newline
    before = record.read_bytes()
    series = load_series(build_series(tmp_path / "s", base_files, [("drop b", {"vllm/b.py": None})]))
    operations.apply(SitePackagesTarget(site), series)
    assert b"vllm/b.py," not in record.read_bytes()
    operations.revert(SitePackagesTarget(site), series)
    assert record.read_bytes() == before


def test_malformed_state_file_is_a_clear_error(site, two_patch_series):
    operations.apply(SitePackagesTarget(site), load_series(two_patch_series))
    state_file = site / f"vllm-0.20.0.dist-info/{STATE_FILE}"
    state = json.loads(state_file.read_text())
    state["patches"][0]["text"] = None
    state_file.write_text(json.dumps(state))
    with pytest.raises(TargetError, match="malformed"):
        operations.revert(SitePackagesTarget(site), load_series(two_patch_series))
