"""The guard without vLLM: its build-time data against the tool's reading of the same series, and its
verdicts on dist-infos whose ``vllm_patch.json`` the tool's own writer produced."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import sys
from importlib.metadata import PathDistribution
from pathlib import Path

import pytest

from guardenv import GUARD, PROJECT, copy_repository
from vllm_patch.engine.state import STATE_FILE, AppliedState
from vllm_patch.lines import line_named, lines_of
from vllm_patch.series import load_series


@pytest.fixture(scope="module")
def guard(setup_module):
    import vllm_patch_guard

    assert Path(vllm_patch_guard.__file__).resolve().parent == GUARD / "src" / "vllm_patch_guard"
    return vllm_patch_guard


@pytest.fixture(scope="module")
def data(setup_module) -> list[dict]:
    return json.loads(setup_module.lines_data(PROJECT))["lines"]


def test_data_is_the_tools_reading_of_every_line(data):
    lines = lines_of(PROJECT)
    assert [d["name"] for d in data] == [line.name for line in lines] == ["current", "v0.20", "v0.25", "v0.27", "v0.32"]
    for entry, line in zip(data, lines, strict=True):
        series = line.load()
        assert entry["version"] == series.pin.version
        assert entry["also"] == list(series.pin.also)
        assert entry["commit"] == series.pin.commit
        assert entry["digest"] == series.digest
        assert [tuple(p) for p in entry["patches"]] == [(p.name, p.sha256) for p in series.patches]


def test_each_covered_release_finds_its_line(guard, data):
    covered = ("0.33.0", "0.32.0", "0.27.1", "0.27.0", "0.25.1", "0.25.0", "0.20.0", "0.20.2")
    assert {v: guard.line_for(v, data)["name"] for v in covered} == {
        "0.33.0": "current", "0.32.0": "v0.32", "0.27.1": "v0.27", "0.27.0": "v0.27", "0.25.1": "v0.25",
        "0.25.0": "v0.25", "0.20.0": "v0.20", "0.20.2": "v0.20"}
    assert guard.line_for("0.28.0", data) is None and guard.line_for("0.26.0", data) is None


def test_data_follows_the_series_it_is_built_from(setup_module, tmp_path):
    repo = copy_repository(tmp_path / "repo")
    before = json.loads(setup_module.lines_data(repo))["lines"][0]
    patch = repo / "patches" / before["patches"][1][0]
    patch.write_bytes(patch.read_bytes().replace(b"\n\n", b"\n\nA changed description.\n\n", 1))
    after = json.loads(setup_module.lines_data(repo))["lines"][0]
    assert after["digest"] != before["digest"]
    assert after["digest"] == load_series(repo).digest


def test_the_guard_imports_the_standard_library_only():
    tree = ast.parse((GUARD / "src" / "vllm_patch_guard" / "__init__.py").read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert names and names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


def fake_vllm(root: Path, version: str, state: bytes | None = None) -> PathDistribution:
    """A vLLM dist-info holding what the guard reads: METADATA and, given, the tool's record."""
    info = root / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    if state is not None:
        (info / STATE_FILE).write_bytes(state)
    return PathDistribution(info)


def recorded(patches) -> bytes:
    """The record `vllm-patch apply` leaves after applying `patches` (the tool's own writer)."""
    return AppliedState.of(list(patches), {}).dump()


CURRENT = line_named(PROJECT, "current").load()
PY = "/opt/venv/bin/python"
FIX = f"run: vllm-patch apply --python {PY}"
HEAD = f"vLLM 0.33.0 has release line current (series {CURRENT.digest}, {len(CURRENT.patches)} patches)"


def test_applied_line_passes(guard, data, tmp_path):
    assert guard.diagnose(fake_vllm(tmp_path, "0.33.0", recorded(CURRENT.patches)), data, PY) is None


def test_patched_wheel_version_passes(guard, data, tmp_path):
    """The patched wheel's dist-info: a local version label and the record, as build-wheel writes them."""
    version = f"0.33.0+vp.{CURRENT.digest}"
    assert guard.diagnose(fake_vllm(tmp_path, version, recorded(CURRENT.patches)), data, PY) is None
    # Its version is the line's (the local label aside): without the record it would be said unapplied.
    found = guard.diagnose(fake_vllm(tmp_path / "bare", version), data, PY)
    assert found == f"{HEAD.replace('0.33.0', version, 1)}, not applied; {FIX}"


def test_unapplied_line_is_named_with_its_fix(guard, data, tmp_path):
    assert guard.diagnose(fake_vllm(tmp_path, "0.33.0"), data, PY) == f"{HEAD}, not applied; {FIX}"


def test_partly_applied_line(guard, data, tmp_path):
    found = guard.diagnose(fake_vllm(tmp_path, "0.33.0", recorded(CURRENT.patches[:2])), data, PY)
    assert found == f"{HEAD}, applied partly (2 of {len(CURRENT.patches)}, up to {CURRENT.names[1]}); {FIX}"


def test_another_series_is_named_by_its_digest(guard, data, tmp_path):
    """An older series: its digest as the tool computes it for that series."""
    older = copy_repository(tmp_path / "older")
    patch = older / "patches" / CURRENT.names[0]
    patch.write_bytes(patch.read_bytes().replace(b"\n\n", b"\n\nAn older description.\n\n", 1))
    series = load_series(older)
    found = guard.diagnose(fake_vllm(tmp_path, "0.33.0", recorded(series.patches)), data, PY)
    assert found == (f"{HEAD}, but another series is applied (series {series.digest}, {len(series.patches)} "
                     f"patches); {FIX} (if it says applied, this guard is older than the series: reinstall it from "
                     "the same checkout)")


def test_the_older_line_is_chosen_by_version(guard, data, tmp_path):
    v020 = line_named(PROJECT, "v0.20").load()
    found = guard.diagnose(fake_vllm(tmp_path, "0.20.0"), data, PY)
    assert found == f"vLLM 0.20.0 has release line v0.20 (series {v020.digest}, 8 patches), not applied; {FIX}"
    assert guard.diagnose(fake_vllm(tmp_path / "b", "0.20.0", recorded(v020.patches)), data, PY) is None


@pytest.mark.parametrize("version", ["0.34.0", "0.33.1", "0.33.0.dev3+g123", "0.20.3"])
def test_a_release_no_line_covers_passes(guard, data, tmp_path, version):
    assert guard.diagnose(fake_vllm(tmp_path, version), data, PY) is None


@pytest.mark.parametrize("version", ["0.20.1", "0.20.2"])
def test_a_release_the_line_declares_gets_the_line(guard, data, tmp_path, version):
    """Line v0.20 declares 0.20.1 and 0.20.2 (``#: also``): the guard names it for them, as the tool picks it."""
    v020 = line_named(PROJECT, "v0.20").load()
    assert version in v020.pin.also
    found = guard.diagnose(fake_vllm(tmp_path, version), data, PY)
    assert found == f"vLLM {version} has release line v0.20 (series {v020.digest}, 8 patches), not applied; {FIX}"


def test_an_unreadable_record_is_said(guard, data, tmp_path):
    state = json.loads(recorded(CURRENT.patches))
    state["schema"] = 99
    found = guard.diagnose(fake_vllm(tmp_path, "0.33.0", json.dumps(state).encode()), data, PY)
    assert found.startswith(f"{HEAD}, but its record vllm_patch.json in the dist-info is unreadable (schema 99")
    assert found.endswith(f"run: vllm-patch status --python {PY}")


def test_the_python_is_quoted_for_the_shell(guard, data, tmp_path):
    found = guard.diagnose(fake_vllm(tmp_path, "0.33.0"), data, "/opt/my venv/bin/python")
    assert found.endswith("run: vllm-patch apply --python '/opt/my venv/bin/python'")


def clean_env(guard, monkeypatch) -> None:
    """Neither variable set, and both as they were after the test (check() sets WARNED itself)."""
    for var in (guard.ENV, guard.WARNED):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)


@pytest.fixture
def problem(guard, monkeypatch):
    clean_env(guard, monkeypatch)
    monkeypatch.setattr(guard, "diagnose", lambda: "vLLM 0.33.0 has release line current, not applied; run: X")
    return guard


def test_warns_once_per_process_tree(problem, capsys):
    problem.check()
    problem.check()
    err = capsys.readouterr().err
    assert err == "vllm-patch-guard: WARNING: vLLM 0.33.0 has release line current, not applied; run: X\n"


def test_strict_refuses_with_one_line(problem, monkeypatch):
    monkeypatch.setenv("VLLM_PATCH_GUARD", "strict")
    with pytest.raises(SystemExit) as exc:
        problem.check()
    assert str(exc.value) == ("vllm-patch-guard: refusing to start (VLLM_PATCH_GUARD=strict): "
                              "vLLM 0.33.0 has release line current, not applied; run: X")


def test_off_says_nothing(problem, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_PATCH_GUARD", "off")
    problem.check()
    assert capsys.readouterr().err == ""


def test_a_failing_check_warns_but_strict_refuses(guard, monkeypatch, capsys, tmp_path):
    dist = fake_vllm(tmp_path, "0.33.0")
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)

    def broken(path=None):
        raise OSError("no lines.json")

    monkeypatch.setattr(guard, "load_lines", broken)
    clean_env(guard, monkeypatch)
    guard.check()
    assert capsys.readouterr().err == ("vllm-patch-guard: WARNING: cannot check the installed vLLM "
                                       "(OSError: no lines.json)\n")
    monkeypatch.setenv("VLLM_PATCH_GUARD", "strict")
    with pytest.raises(SystemExit):
        guard.check()
