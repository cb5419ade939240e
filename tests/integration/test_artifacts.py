"""The patched wheel from the real upstream wheel, and the Dockerfile's vllm-patch steps run
against a real virtualenv (tests/integration/test_image.py builds the image itself)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import run_cli
from realvllm import NEW_KERNEL, make_venv
from vllm_patch.engine.analysis import analyze
from vllm_patch.series import load_series

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROJECT = Path(__file__).resolve().parents[2]


def dockerfile_runs(path: Path) -> dict[str, list[str]]:
    """RUN commands per stage, continuation lines joined."""
    stages: dict[str, list[str]] = {}
    current = ""
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "FROM":
            current = words[3] if len(words) >= 4 and words[2].upper() == "AS" else words[1]
            stages[current] = []
        elif words[0].upper() == "RUN":
            stages[current].append(" ".join(words[1:]))
    return stages


# The guard (guard/) goes into vLLM's environment after the freeze check, and its entry point runs strict.
GUARD = ["python3 -m pip install --no-cache-dir --no-deps /opt/vllm-patch/vllm_patch_guard-*.whl",
         'python3 -c "from importlib.metadata import entry_points; [ep.load()() for ep in '
         "entry_points(group='vllm.general_plugins') if ep.name == 'vllm_patch_guard']\""]
EXPECTED = {
    "tool-wheel": ["python3 -m pip wheel --no-cache-dir --no-deps /src /src/guard -w /wheels"],
    "tool": ["mkdir -p /opt/vllm-patch && python3 -m pip freeze --all > /opt/vllm-patch/freeze-before.txt "
             "&& python3 -m venv /opt/vllm-patch/venv "
             "&& /opt/vllm-patch/venv/bin/pip install --no-cache-dir /tmp/tool-wheels/vllm_patch-*.whl "
             "&& mv /tmp/tool-wheels/vllm_patch_guard-*.whl /opt/vllm-patch/ && rm -rf /tmp/tool-wheels "
             "&& ln -s /opt/vllm-patch/venv/bin/vllm-patch /usr/local/bin/vllm-patch"],
    "from-wheel": ["python3 -m pip install --no-cache-dir --no-deps --force-reinstall /tmp/dist/vllm-*+vp.*.whl "
                   "&& rm -rf /tmp/dist",
                   "vllm-patch status --python python3 --expect applied",
                   "python3 -m pip freeze --all | grep -v '^vllm[=@ ]' > /tmp/freeze-after.txt "
                   "&& grep -v '^vllm[=@ ]' /opt/vllm-patch/freeze-before.txt | diff - /tmp/freeze-after.txt "
                   "&& rm /tmp/freeze-after.txt", *GUARD],
    "patched": ["vllm-patch apply --python python3",
                "vllm-patch status --python python3 --expect applied",
                "python3 -m pip freeze --all | diff /opt/vllm-patch/freeze-before.txt -", *GUARD],
}


def test_dockerfile_runs_exactly_the_tested_commands_and_lints_clean():
    """The steps below (and tests/integration/test_image.py, which builds the image) test these commands."""
    assert dockerfile_runs(PROJECT / "Dockerfile") == EXPECTED
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint) if hadolint.exists() else "hadolint", "--failure-threshold", "warning",
                             str(PROJECT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_defaults_follow_the_chosen_lines_pin():
    """The Dockerfile's base and `make image`'s tags are the current line's release; LINE=v0.20 gives 0.20's."""
    pin = load_series(PROJECT).pin
    assert f"ARG VLLM_IMAGE=vllm/vllm-openai:{pin.tag}\n" in (PROJECT / "Dockerfile").read_text()
    for args, version in (((), pin.version), (("LINE=v0.20",), "0.20.0"), (("LINE=current",), pin.version)):
        made = subprocess.run(["make", "-s", "-n", "-C", str(PROJECT), "image", *args], capture_output=True,
                              text=True)
        assert made.returncode == 0, made.stderr
        assert f"scripts/build-image patched vllm-patch:{version} vllm/vllm-openai:v{version}" in made.stdout


def run_step(command: str, python: Path, series: Path) -> subprocess.CompletedProcess:
    """A `vllm-patch` RUN step of the Dockerfile against a test venv: the image's
    ``VLLM_PATCH_SERIES`` is `series`, its ``python3`` is `python`."""
    words = [str(python) if w == "python3" else w for w in shlex.split(command)]
    assert words[0] == "vllm-patch"
    words[0] = str(Path(sys.executable).parent / "vllm-patch")
    return subprocess.run(words, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_PATCH_SERIES": str(series)})


def test_image_steps_apply_the_series_to_the_installed_vllm(venv_python, real_series):
    for step in EXPECTED["patched"][:2]:
        result = run_step(step, venv_python, real_series)
        assert result.returncode == 0, (step, result.stdout, result.stderr)
    status = run_cli("--series", str(real_series), "status", "--python", str(venv_python), "--json")
    assert json.loads(status.stdout)["verdict"] == "applied"
    assert run_cli("--series", str(real_series), "revert", "--python", str(venv_python)).returncode == 0
    failing = run_step(EXPECTED["patched"][1], venv_python, real_series)
    assert failing.returncode == 1  # the image build would stop here


def test_patched_wheel_from_the_real_wheel(real_series, wheel_file, tmp_path):
    dist = tmp_path / "dist"
    result = run_cli("--series", str(real_series), "build-wheel", "--from", str(wheel_file), "--out", str(dist),
                     "--json")
    assert result.returncode == 0, result.stderr
    built = json.loads(result.stdout)
    series = load_series(real_series)
    assert built["version"] == f"0.20.0+vp.{series.digest}"
    path = Path(built["wheel"])
    assert path.name.endswith("-cp38-abi3-manylinux_2_35_x86_64.whl")
    # The wheel differs from upstream exactly by the series (and its dist-info).
    with zipfile.ZipFile(wheel_file) as up, zipfile.ZipFile(path) as out:
        up_names = {n for n in up.namelist() if ".dist-info/" not in n}
        out_names = {n for n in out.namelist() if ".dist-info/" not in n}
        assert out_names - up_names == {NEW_KERNEL}
        touched = series.touched_paths()
        expected = analyze(list(series.patches), {p: up.read(p) if p in up_names else None for p in touched})
        for name in sorted(out_names):
            data = out.read(name)
            if name in touched:
                assert data == expected.patched[name], name
            else:
                assert out.getinfo(name).CRC == up.getinfo(name).CRC, name
    # It installs into a fresh venv as the image's from-wheel step installs it, and checks there.
    python = make_venv(tmp_path / "venv", None)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(path)],
                   check=True, timeout=600)
    result = run_step(EXPECTED["from-wheel"][1], python, real_series)
    assert result.returncode == 0, (result.stdout, result.stderr)
    shown = subprocess.run([str(python), "-m", "pip", "show", "vllm"], capture_output=True, text=True).stdout
    assert f"Version: {built['version']}" in shown
    status = json.loads(run_cli("--series", str(real_series), "status", "--python", str(python), "--full",
                                "--json").stdout)
    assert status["verdict"] == "applied" and status["record_problems"] == []
    listing = "import importlib.metadata as m; print([str(f) for f in m.files('vllm')])"
    files = subprocess.run([str(python), "-c", listing], capture_output=True, text=True, check=True).stdout
    assert NEW_KERNEL in files


def test_build_wheel_refuses_a_wheel_with_the_pinned_name_and_other_bytes(real_series, tmp_path):
    fake = tmp_path / "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl"
    fake.write_bytes(b"not the wheel")
    result = run_cli("--series", str(real_series), "build-wheel", "--from", str(fake), "--out", str(tmp_path / "d"))
    assert result.returncode == 2 and "does not match the pin" in result.stderr
    assert not (tmp_path / "d").exists()
