"""The container image, built for real with buildah from the project's Dockerfile, on a local
stand-in for vllm/vllm-openai (``scripts/image-base``: Debian, Python and the real vLLM 0.20.0
wheel installed --no-deps), since no image registry is reachable. The image installs the tool's own wheel,
which bundles every release line, and applies the one proven on its vLLM: here line v0.20, not the current
(top-level) one.

Both targets build (each runs ``status --expect applied`` and compares vLLM's ``pip freeze``
with the one taken before the tool came in); then a container of each result is asked again,
from outside the build, with ``buildah run``."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import run_cli
from vllm_patch.lines import line_named

PROJECT = Path(__file__).resolve().parents[2]
BASE_TAG = "localhost/vllm-base:{version}"
ENGINE = {"STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}
NEEDS = "builds need root, buildah and debootstrap (apt-get install buildah debootstrap; .ci/run installs them)"
LINE = "v0.20"  # the line pinned to the base image's vLLM (conftest's pin)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.image,
    pytest.mark.slow,
    pytest.mark.skipif(not (shutil.which("buildah") and shutil.which("debootstrap") and os.geteuid() == 0),
                       reason=NEEDS),
]


def buildah(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **ENGINE})


@pytest.fixture(scope="module")
def base_image(wheel_file, pin) -> str:
    tag = BASE_TAG.format(version=pin.version)
    result = subprocess.run([str(PROJECT / "scripts" / "image-base"), str(wheel_file), tag], capture_output=True,
                            text=True, timeout=1800, env={**os.environ, **ENGINE})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tag


@pytest.fixture(scope="module")
def context(tmp_path_factory, wheel_file) -> Path:
    """What the Dockerfile copies: what the tool's wheel is built from (the package, its build step,
    series, patches and lines), and dist/ with the patched wheel the tool builds (with line v0.20)
    from the real one."""
    ctx = tmp_path_factory.mktemp("image") / "ctx"
    ctx.mkdir()
    for name in ("Dockerfile", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "series"):
        shutil.copy2(PROJECT / name, ctx / name)
    for name in ("tool", "patches", "lines", "guard"):
        shutil.copytree(PROJECT / name, ctx / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = run_cli("--series", str(PROJECT), "--line", LINE, "build-wheel", "--from", str(wheel_file),
                    "--out", str(ctx / "dist"))
    assert built.returncode == 0, built.stderr
    return ctx


@functools.cache
def build(context: Path, base: str, target: str) -> str:
    """The image of `target`, built once per test run."""
    tag = f"localhost/vllm-patch-test:{target}"
    result = buildah("build", "--layers=false", "--build-arg", f"VLLM_IMAGE={base}", "--target", target,
                     "-t", tag, str(context))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return tag


def run_in(image: str, *command: str) -> subprocess.CompletedProcess:
    """`command` in a fresh container of `image` (removed after)."""
    made = buildah("from", "--pull-never", image)
    assert made.returncode == 0, made.stderr
    container = made.stdout.strip().splitlines()[-1]
    try:
        return buildah("run", container, "--", *command)
    finally:
        buildah("rm", container)


@pytest.mark.parametrize("target", ["patched", "from-wheel"])
def test_image_builds_and_reports_every_patch_applied(base_image, context, target):
    image = build(context, base_image, target)
    status = run_in(image, "vllm-patch", "status", "--python", "python3", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    names = [p.name for p in line_named(PROJECT, LINE).load().patches]
    assert report["verdict"] == "applied"
    assert [(p["name"], p["state"]) for p in report["patches"]] == [(n, "applied") for n in names]
    assert any(f"release line {LINE}" in note for note in report["notes"]), report["notes"]
    assert "bundled with vllm-patch" in report["series_from"], report["series_from"]

    # The tool lives in its own virtualenv: vLLM's interpreter sees no new distribution but the guard.
    freeze = run_in(image, "python3", "-m", "pip", "freeze", "--all")
    before = run_in(image, "cat", "/opt/vllm-patch/freeze-before.txt")
    assert freeze.returncode == 0 and before.returncode == 0

    def others(text: str) -> list[str]:
        return [line for line in text.splitlines()
                if not line.startswith(("vllm==", "vllm @", "vllm-patch-guard"))]

    assert others(freeze.stdout) == others(before.stdout)
    version = run_in(image, "python3", "-c", "import importlib.metadata as m; print(m.version('vllm'))")
    assert ("+vp." in version.stdout) == (target == "from-wheel"), version.stdout + version.stderr
    tool_import = run_in(image, "python3", "-c", "import vllm_patch")
    assert tool_import.returncode != 0, "vllm_patch is importable from vLLM's interpreter"
    assert any(line.startswith("vllm-patch-guard") for line in freeze.stdout.splitlines()), freeze.stdout


GUARD = ("python3", "-c", "from importlib.metadata import entry_points; "
         "[ep.load()() for ep in entry_points(group='vllm.general_plugins') if ep.name == 'vllm_patch_guard']")


def test_image_guard_refuses_a_vllm_whose_series_was_reverted(base_image, context):
    """The image runs the guard strict: its entry point (as vLLM's plugin loader calls it) passes on the
    patched image and refuses, in one line, once the series is reverted in a container of it."""
    image = build(context, base_image, "patched")
    made = buildah("from", "--pull-never", image)
    assert made.returncode == 0, made.stderr
    container = made.stdout.strip().splitlines()[-1]
    try:
        assert buildah("run", container, "--", *GUARD).returncode == 0
        reverted = buildah("run", container, "--", "vllm-patch", "revert", "--python", "python3")
        assert reverted.returncode == 0, reverted.stdout + reverted.stderr
        refused = buildah("run", container, "--", *GUARD)
        assert refused.returncode != 0
        assert "not applied" in refused.stderr and "vllm-patch apply" in refused.stderr, refused.stderr
    finally:
        buildah("rm", container)
