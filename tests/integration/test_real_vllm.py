"""The tool on the real vLLM 0.20.0 source tree (sdist) and the real wheel in a venv."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import git, run_cli
from realvllm import AMBIGUOUS_AT, NEW_KERNEL, RUNNER, TQ

pytestmark = pytest.mark.integration


def digests(root: Path, skip_pyc: bool = True) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            if skip_pyc and name.endswith(".pyc"):
                continue
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def test_check_on_the_cached_pinned_sdist(real_series):
    result = run_cli("--series", str(real_series), "check", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [p["state"] for p in data["patches"]] == ["applies"] * 4
    assert data["found"]["commit"] == "gb8160878f"


def test_ambiguous_hunk_in_gpu_model_runner_lists_both_places(ambiguous_series, sdist_tree):
    result = run_cli("--series", str(ambiguous_series), "check", "--base", str(sdist_tree), "--json")
    assert result.returncode == 1
    patch = json.loads(result.stdout)["patches"][0]
    assert patch["state"] == "ambiguous"
    hunk = patch["hunks"][0]
    assert hunk["path"] == RUNNER and tuple(hunk["anchor_at"]) == AMBIGUOUS_AT
    assert f"lines {AMBIGUOUS_AT[0]}, {AMBIGUOUS_AT[1]}" in patch["problems"][0]


@pytest.fixture(scope="module")
def checkout(sdist_tree, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("checkout") / "vllm"
    shutil.copytree(sdist_tree, root, symlinks=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "core.autocrlf", "false")
    git(root, "add", "-A", "-f")
    git(root, "commit", "-q", "-m", "vLLM 0.20.0 (sdist)")
    git(root, "tag", "v0.20.0")
    return root


def test_git_am_of_the_series_works_on_the_base(checkout, real_series):
    git(checkout, "checkout", "-q", "-b", "am-test", "v0.20.0")
    try:
        patches = sorted(str(p) for p in (real_series / "patches").glob("*.patch"))
        git(checkout, "am", "-q", *patches)
        assert (checkout / NEW_KERNEL).is_file()
        result = run_cli("--series", str(real_series), "status", "--target", str(checkout), "--json")
        assert json.loads(result.stdout)["verdict"] == "applied"
    finally:
        git(checkout, "checkout", "-q", "main")
        git(checkout, "branch", "-q", "-D", "am-test")


def test_checkout_commit_round_trip(checkout, real_series):
    s = ("--series", str(real_series))
    result = run_cli(*s, "apply", "--target", str(checkout), "--commit")
    assert result.returncode == 0, result.stderr
    subjects = git(checkout, "log", "--format=%s", "-4").decode().splitlines()
    assert subjects[-1] == "TurboQuant: test change with a new kernel module"
    assert json.loads(run_cli(*s, "status", "--target", str(checkout), "--json").stdout)["verdict"] == "applied"
    assert run_cli(*s, "revert", "--target", str(checkout), "--commit").returncode == 0
    assert git(checkout, "diff", "v0.20.0", "HEAD") == b""
    assert git(checkout, "status", "--porcelain") == b""


def test_plain_tree_round_trip_is_byte_exact(sdist_tree, real_series, tmp_path):
    tree = tmp_path / "vllm-0.20.0"
    shutil.copytree(sdist_tree, tree, symlinks=True)
    before = digests(tree)
    s = ("--series", str(real_series))
    assert run_cli(*s, "apply", "--target", str(tree)).returncode == 0
    assert b"# vllm-patch test: capture policy" in (tree / TQ).read_bytes()
    assert run_cli(*s, "revert", "--target", str(tree)).returncode == 0
    assert digests(tree) == before


def site_of(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def test_site_packages_round_trip(venv_python, real_series):
    site = site_of(venv_python)
    record = site / "vllm-0.20.0.dist-info/RECORD"
    before, record_before = digests(site), record.read_bytes()
    s = ("--series", str(real_series))
    result = run_cli(*s, "apply", "--python", str(venv_python), "--json")
    assert result.returncode == 0, result.stderr
    assert not list((site / "vllm/v1/attention/backends/__pycache__").glob("turboquant_attn.*.pyc"))
    status = json.loads(run_cli(*s, "status", "--python", str(venv_python), "--full", "--json").stdout)
    assert status["verdict"] == "applied" and status["record_problems"] == []
    listed = subprocess.run([str(venv_python), "-c",
                             "import importlib.metadata as m; print([str(f) for f in m.files('vllm')])"],
                            capture_output=True, text=True, check=True).stdout
    assert NEW_KERNEL in listed
    result = run_cli(*s, "revert", "--python", str(venv_python))
    assert result.returncode == 0, result.stderr
    assert record.read_bytes() == record_before
    assert digests(site) == before
    status = json.loads(run_cli(*s, "status", "--python", str(venv_python), "--full", "--json").stdout)
    assert status["verdict"] == "applies" and status["record_problems"] == []


def test_site_packages_killed_between_two_writes_recovers(venv_python, real_series):
    site = site_of(venv_python)
    before = digests(site)
    s = ("--series", str(real_series))
    killed = run_cli(*s, "apply", "--python", str(venv_python),
                     env={"VLLM_PATCH_FAULT_AFTER_WRITES": "3"})
    assert killed.returncode == -9
    assert digests(site) != before
    result = run_cli(*s, "status", "--python", str(venv_python), "--json")
    data = json.loads(result.stdout)
    assert "rolled back" in data["recovered"] and data["verdict"] == "applies"
    assert digests(site) == before
