"""Every release line checks against its own pinned release's sdist: the current line (the top-level series,
vLLM 0.33.0), lines v0.32, v0.27 and v0.25 (the current line's fixes carried to 0.32.0, 0.27.1 and 0.25.1) and
the maintained line v0.20 (vLLM 0.20.0). A line also proven on other releases (``#: also``: 0.20.1 and 0.20.2
for line v0.20, 0.27.0 and 0.25.0 for lines v0.27 and v0.25) applies cleanly to each of them and is chosen for
them by itself. (A line that carries the current line's fixes to an earlier release runs the current line's
tests on that release's own files: tests/lines/v0_33, parametrized by line.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import git, run_cli
from vllm_patch.infrastructure.downloads import cache_root, fetch, indexed_artifact, pinned_base_tree, unpack_sdist
from vllm_patch.lines import CURRENT, line_named, lines_of

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]
# The lines CI must check, with the release each is pinned to.
MAINTAINED = {CURRENT: "0.33.0", "v0.32": "0.32.0", "v0.27": "0.27.1", "v0.25": "0.25.1", "v0.20": "0.20.0"}
# The other releases each line is proven on (its series' ``#: also``).
ALSO = {"v0.20": ("0.20.1", "0.20.2"), "v0.27": ("0.27.0",), "v0.25": ("0.25.0",)}


def test_the_maintained_lines_are_there_with_their_pins():
    pins = {line.name: line.load().pin.version for line in lines_of(PROJECT)}
    assert {name: pins.get(name) for name in MAINTAINED} == MAINTAINED


@pytest.mark.parametrize("line", [line.name for line in lines_of(PROJECT)])
def test_each_line_checks_on_its_pinned_release(line):
    version = line_named(PROJECT, line).load().pin.version
    result = run_cli("--line", line, "check", cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    assert "apply cleanly" in result.stdout and f"vLLM found: {version} " in result.stdout


def test_the_releases_each_line_declares_are_the_ones_checked_here():
    assert {line.name: line.load().pin.also for line in lines_of(PROJECT) if line.load().pin.also} == ALSO


@pytest.mark.slow
@pytest.mark.parametrize(("line", "version"), [(line, v) for line, vs in sorted(ALSO.items()) for v in vs])
def test_a_line_applies_cleanly_to_the_other_releases_it_declares(line, version):
    """Every patch applies cleanly, in series order, with unique anchors, to each release the line declares
    besides its pin (`check` on that release's sdist tree: its own pin is not asked for)."""
    artifact = indexed_artifact("vllm", f"vllm-{version}.tar.gz")
    tree = unpack_sdist(fetch(artifact, quiet=True), artifact.sha256, cache_root() / "trees")
    result = run_cli("--line", line, "check", "--base", str(tree), "--json", cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["found"]["version"] == version
    states = [p["state"] for p in data["patches"]]
    assert len(states) == len(line_named(PROJECT, line).load().patches), states
    assert set(states) == {"applies"}, states


@pytest.mark.slow
@pytest.mark.parametrize(("version", "line"), [("0.20.1", "v0.20"), ("0.20.2", "v0.20"), ("0.25.0", "v0.25"),
                                               ("0.25.1", "v0.25"), ("0.27.0", "v0.27"), ("0.27.1", "v0.27"),
                                               ("0.32.0", "v0.32")])
def test_a_release_a_line_covers_gets_it_without_force(version, line, tmp_path):
    """The releases a line is pinned to or declares: apply, status and revert choose it by themselves, and revert
    restores the tree byte for byte; no line for it was the current line's conflicts before."""
    from helpers import snapshot

    artifact = indexed_artifact("vllm", f"vllm-{version}.tar.gz")
    source = unpack_sdist(fetch(artifact, quiet=True), artifact.sha256, cache_root() / "trees")
    tree = tmp_path / "tree"
    shutil.copytree(source / "vllm", tree / "vllm")
    before = snapshot(tree)
    names = list(line_named(PROJECT, line).load().names)
    for command, state in (("apply", "applies"), ("status", "applied"), ("revert", "applied")):
        result = run_cli(command, "--target", str(tree), "--json", cwd=PROJECT)
        assert result.returncode == 0, (command, result.stderr)
        data = json.loads(result.stdout)
        assert [(p["name"], p["state"]) for p in data["patches"]] == [(n, state) for n in names], command
        assert any(f"release line {line}" in note for note in data["notes"]), (command, data["notes"])
    assert snapshot(tree) == before


@pytest.mark.slow
@pytest.mark.parametrize("line", [line.name for line in lines_of(PROJECT)])
def test_each_line_exported_applies_with_git_am_to_its_release(line, tmp_path):
    """A line's stored series may name patches it carries from another line (``NAME from LINE``); exported, it is
    a plain series that ``git am`` applies in order to a git repository of the pinned release."""
    series = line_named(PROJECT, line).load()
    out = tmp_path / "exported"
    done = run_cli("--line", line, "export", str(out), cwd=PROJECT)
    assert done.returncode == 0, done.stderr
    names = [n for n in (out / "series").read_text().splitlines() if n and not n.startswith("#")]
    assert names == list(series.names)
    repo = tmp_path / "vllm"
    shutil.copytree(pinned_base_tree(series.pin, quiet=True), repo, ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"vLLM {series.pin.version}")
    for name in names:
        git(repo, "am", "-q", "--keep-cr", str(out / "patches" / name))
    assert len(git(repo, "log", "--oneline").decode().splitlines()) == len(names) + 1


@pytest.mark.slow
def test_a_kernel_fix_made_once_reaches_every_line_that_carries_it(tmp_path):
    """The multi-query kernel changed once, in the current line's 0003 (`refresh`), then `carry` in the lines that
    add it in a 0003 of their own: every line that carries it adds the new text, and every line still checks on
    its release (line v0.32 lists the current line's 0003 itself)."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copyfile(PROJECT / "series", project / "series")
    for part in ("patches", "lines"):
        shutil.copytree(PROJECT / part, project / part)
    name = "0003-turboquant-multi-query-verify-kernel.patch"
    current = line_named(project, CURRENT).load()
    partial = tmp_path / "partial"
    assert run_cli("--series", str(project), "export", str(partial)).returncode == 0
    text = (partial / "series").read_text()
    (partial / "series").write_text(text[:text.index(name) + len(name)] + "\n")
    tree = tmp_path / "tree"
    shutil.copytree(pinned_base_tree(current.pin, quiet=True), tree, ignore=shutil.ignore_patterns("__pycache__"))
    assert run_cli("--series", str(partial), "apply", "--target", str(tree)).returncode == 0
    kernel = tree / "vllm/v1/attention/ops/triton_turboquant_verify.py"
    kernel.write_text(kernel.read_text().replace("_MAX_REGISTERS = 255\n", "_MAX_REGISTERS = 254\n", 1))
    done = run_cli("--series", str(project), "refresh", name, "--from", str(tree))
    assert done.returncode == 0, done.stderr
    for line in ("v0.27", "v0.25"):
        done = run_cli("--series", str(project / "lines" / line), "carry")
        assert done.returncode == 0, done.stderr
    for line in (CURRENT, "v0.32", "v0.27", "v0.25"):
        series = line_named(project, line).load()
        assert "+_MAX_REGISTERS = 254\n" in series.patches[series.names.index(name)].raw.decode(), line
        assert run_cli("--line", line, "check", cwd=project).returncode == 0, line
