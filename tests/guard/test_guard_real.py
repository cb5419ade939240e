"""The guard at the start of the real vLLM 0.33.0: its wheel (from PyPI, cached) installed ``--no-deps`` into a
virtualenv with the guard's wheel built by pip from a copy of this repository; the series applied, partly
applied and reverted by this checkout's tool; vLLM's own plugin loader calling the guard (vllm_start.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from guardenv import (
    PROJECT,
    build_wheel,
    copy_repository,
    dist_info,
    guard_lines,
    make_vllm_venv,
    put,
    start,
    tool,
)
from vllm_patch.lines import line_named
from vllm_patch.series import load_series

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CURRENT = line_named(PROJECT, "current").load()


@pytest.fixture(scope="session")
def guard_wheel(tmp_path_factory) -> Path:
    repo = copy_repository(tmp_path_factory.mktemp("guard-build") / "repo")
    return build_wheel(repo / "guard", repo.parent / "dist")


@pytest.fixture(scope="session")
def vllm_py(guard_wheel, tmp_path_factory) -> Path:
    py = make_vllm_venv(tmp_path_factory.mktemp("guard-venv") / "venv", guard_wheel)
    no_torch = subprocess.run([str(py), "-c", "import torch"], capture_output=True)
    assert no_torch.returncode != 0, "the test's vLLM must start without torch"
    return py


def series_copy(dest: Path, keep: int | None = None, edit: str | None = None) -> Path:
    """The current line, its first `keep` patches only, or with patch `edit`'s description changed."""
    dest.mkdir()
    shutil.copytree(PROJECT / "patches", dest / "patches")
    text = (PROJECT / "series").read_text()
    if keep is not None:
        for name in CURRENT.names[keep:]:
            text = text.replace(name + "\n", "")
    (dest / "series").write_text(text)
    if edit is not None:
        patch = dest / "patches" / edit
        patch.write_bytes(patch.read_bytes().replace(b"\n\n", b"\n\nAn older description.\n\n", 1))
    return dest


def warning(py: Path, rest: str) -> str:
    return (f"vllm-patch-guard: WARNING: vLLM 0.33.0 has release line current "
            f"(series {CURRENT.digest}, {len(CURRENT.patches)} patches){rest}; run: vllm-patch apply --python {py}")


def test_the_wheel_carries_the_generated_data_and_the_entry_point(guard_wheel):
    with zipfile.ZipFile(guard_wheel) as whl:
        data = json.loads(whl.read("vllm_patch_guard/lines.json"))
        entry_points = whl.read("vllm_patch_guard-0.1.0.dist-info/entry_points.txt").decode()
    assert [(d["name"], d["version"], d["digest"]) for d in data["lines"]] == [
        (line, line_named(PROJECT, line).load().pin.version, line_named(PROJECT, line).load().digest)
        for line in ("current", "v0.20", "v0.25", "v0.27", "v0.32")]
    assert "[vllm.general_plugins]\nvllm_patch_guard = vllm_patch_guard:check" in entry_points


def test_unpatched_vllm_warns(vllm_py):
    put(vllm_py)
    done = start(vllm_py)
    assert done.returncode == 0 and done.stdout == "started\n"
    assert done.stderr.splitlines() == [warning(vllm_py, ", not applied")]


def test_unpatched_vllm_warns_beside_vllms_own_plugins(vllm_py):
    """No VLLM_PLUGINS allowlist: vLLM's LoRA resolver plugins load too (here they fail without their
    dependencies, and vLLM's loader logs that); the guard still says its one line."""
    put(vllm_py)
    done = start(vllm_py, plugins=None)
    assert done.returncode == 0 and done.stdout == "started\n"
    assert guard_lines(done.stderr) == [warning(vllm_py, ", not applied")]


def test_one_warning_for_the_process_tree(vllm_py):
    """vLLM starts more processes (engine core, workers), each loading the plugins: one warning in all."""
    put(vllm_py)
    done = start(vllm_py, "--child")
    assert done.returncode == 0 and done.stdout == "started\nstarted\n"
    assert done.stderr.splitlines() == [warning(vllm_py, ", not applied")]


def test_patched_vllm_starts_silently(vllm_py):
    put(vllm_py, PROJECT)
    for env in ({}, {"VLLM_PATCH_GUARD": "strict"}):
        done = start(vllm_py, env=env)
        assert (done.returncode, done.stdout, done.stderr) == (0, "started\n", "")


def test_partly_patched_vllm_warns(vllm_py, tmp_path):
    put(vllm_py, series_copy(tmp_path / "two", keep=2))
    done = start(vllm_py)
    assert done.returncode == 0
    partly = f", applied partly (2 of {len(CURRENT.names)}, up to {CURRENT.names[1]})"
    assert done.stderr.splitlines() == [warning(vllm_py, partly)]


def test_an_older_series_warns_with_its_digest(vllm_py, tmp_path):
    older = series_copy(tmp_path / "older", edit=CURRENT.names[2])
    put(vllm_py, older)
    done = start(vllm_py)
    old = load_series(older).digest
    assert old != CURRENT.digest
    other = f", but another series is applied (series {old}, {len(CURRENT.names)} patches)"
    assert done.stderr.splitlines() == [warning(vllm_py, other)
                                        + " (if it says applied, this guard is older than the series: reinstall it "
                                          "from the same checkout)"]


def test_strict_refuses_to_start_with_one_line(vllm_py):
    put(vllm_py)
    done = start(vllm_py, env={"VLLM_PATCH_GUARD": "strict"})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        warning(vllm_py, ", not applied").replace("WARNING:", "refusing to start (VLLM_PATCH_GUARD=strict):")]


@pytest.mark.parametrize(("version", "says"), [("0.33.0", True), ("0.34.0", False)])
def test_a_release_no_line_covers_starts_silently(vllm_py, tmp_path, version, says):
    """The installed dist-info, copied ahead of site-packages on sys.path with its METADATA's version set to
    `version`: vLLM's loader and the guard both read that one (0.33.0 shows the copy is what is read)."""
    put(vllm_py)
    overlay = tmp_path / "overlay"
    info = shutil.copytree(dist_info(vllm_py), overlay / f"vllm-{version}.dist-info")
    metadata = info / "METADATA"
    metadata.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", metadata.read_text(), count=1))
    for env in ({}, {"VLLM_PATCH_GUARD": "strict"}):
        done = start(vllm_py, env={"PYTHONPATH": str(overlay), **env})
        assert done.returncode == (1 if says and env else 0)
        assert bool(done.stderr) == says, done.stderr


def test_the_patched_wheel_starts_silently(guard_wheel, tmp_path):
    """The wheel ``vllm-patch build-wheel`` makes (version 0.33.0+vp.DIGEST, the record in its dist-info)."""
    done = tool("build-wheel", "--out", str(tmp_path / "dist"))
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob(f"vllm-0.33.0+vp.{CURRENT.digest}-*.whl")
    py = make_vllm_venv(tmp_path / "venv", guard_wheel, wheel)
    for env in ({}, {"VLLM_PATCH_GUARD": "strict"}):
        done = start(py, env=env)
        assert (done.returncode, done.stdout, done.stderr) == (0, "started\n", "")
