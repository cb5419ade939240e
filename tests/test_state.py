"""The applied-patches record (vllm_patch.json): one format for both writers, with a schema number."""

from __future__ import annotations

import json
import zipfile

import pytest
from click.testing import CliRunner

from helpers import make_site_packages, snapshot
from test_wheel import make_wheel
from vllm_patch import operations
from vllm_patch.artifacts.wheel import build_wheel
from vllm_patch.cli import main
from vllm_patch.engine.state import SCHEMA, STATE_FILE, AppliedState, load
from vllm_patch.errors import TargetError
from vllm_patch.series import load_series
from vllm_patch.targets import SitePackagesTarget


def test_round_trip_and_legacy_files():
    state = AppliedState((("0001-x.patch", "ab" * 32, "text"),), {"vllm/a.py": "vllm/a.py,sha256=x,3"},
                         {"vllm/a.py": 4})
    data = state.dump()
    assert json.loads(data)["schema"] == SCHEMA and load(data, "here") == state
    legacy = {"tool": "vllm-patch 0.1.0", "patches": [{"name": "0001-x.patch", "sha256": "ab" * 32, "text": "text"}],
              "record": {"vllm/a.py": "vllm/a.py,sha256=x,3"}}
    assert load(json.dumps(legacy).encode(), "here") == AppliedState(state.patches, state.record, {})


@pytest.mark.parametrize(("data", "message"), [
    (b'{"schema": 99, "tool": "vllm-patch 9.0", "patches": []}', "schema 99, written by vllm-patch 9.0"),
    (b'{"schema": 1, "patches": [{"name": 1}]}', "malformed"),
    (b"[1, 2]", "malformed"),
    (b"{trunc", "unreadable"),
])
def test_unknown_or_broken_files_are_refused(data, message):
    with pytest.raises(TargetError, match=message):
        load(data, "vllm-0.20.0.dist-info/vllm_patch.json")


def test_both_writers_write_the_same_format(tmp_path, base_files, two_patch_series):
    series = load_series(two_patch_series)
    site = make_site_packages(tmp_path / "site", base_files)
    assert operations.apply(SitePackagesTarget(site), series).ok
    from_target = json.loads((site / f"vllm-0.20.0.dist-info/{STATE_FILE}").read_text())
    built = build_wheel(series, make_wheel(tmp_path / "in", base_files), tmp_path / "dist")
    with zipfile.ZipFile(built.path) as zf:
        from_wheel = json.loads(zf.read(f"vllm-{built.version}.dist-info/{STATE_FILE}"))
    assert set(from_wheel) == set(from_target) and from_wheel["schema"] == from_target["schema"] == SCHEMA
    assert from_wheel["patches"] == from_target["patches"]
    assert from_wheel["record"].keys() == from_target["record"].keys()


def test_a_state_from_a_newer_tool_is_refused_by_the_cli(tmp_path, base_files, two_patch_series):
    site = make_site_packages(tmp_path / "site", base_files)
    assert operations.apply(SitePackagesTarget(site), load_series(two_patch_series)).ok
    path = site / f"vllm-0.20.0.dist-info/{STATE_FILE}"
    path.write_text(path.read_text().replace(f'"schema": {SCHEMA}', '"schema": 2'))
    before = snapshot(site)
    for command in ("status", "apply", "revert"):
        result = CliRunner().invoke(main, ["--series", str(two_patch_series), command, "--target", str(site)])
        assert result.exit_code == 2 and "Traceback" not in result.output
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert "schema 2" in line and "upgrade vllm-patch" in line
    assert snapshot(site) == before
