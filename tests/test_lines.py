"""Release lines: the top-level series (``current``) and ``lines/NAME``; a target gets the
line pinned to its vLLM, ``--line`` chooses, and a target no line fits is refused in one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import build_series, edit, git_repo, run_cli, snapshot, write_tree
from vllm_patch.errors import InputError, PinMismatch
from vllm_patch.lines import CURRENT, line_for, line_named, lines_of, nearest
from vllm_patch.series import project_of

OLD_VERSION_PY = b"__version__ = version = '0.19.1'\n__commit_id__ = commit_id = 'g0123456789'\n"
OLD_PIN = {"version": "0.19.1", "tag": "v0.19.1", "commit": "0123456789"}


def _repin(series_dir: Path, pin: dict[str, str]) -> None:
    """Point a test series at another release (its artifacts' names follow; nothing downloads them)."""
    text = (series_dir / "series").read_text()
    for key, value in pin.items():
        text = re.sub(rf"(?m)^#: {key} = .*$", f"#: {key} = {value}", text)
    text = re.sub(r"(?m)^(#: (?:sdist|wheel) = vllm-)0\.20\.0", rf"\g<1>{pin['version']}", text)
    (series_dir / "series").write_text(text)


@pytest.fixture
def project(tmp_path, base_files, two_patch_series) -> Path:
    """The current line (0.20.0, two patches) and lines/v0.19 (0.19.1, one other patch)."""
    root = tmp_path / "project"
    shutil.copytree(two_patch_series, root)
    old_base = {**base_files, "vllm/_version.py": OLD_VERSION_PY}
    old = build_series(root / "lines" / "v0.19", old_base, [
        ("old fix", {"vllm/b.py": edit(base_files["vllm/b.py"], b"return 2\n", b"return 22\n")})])
    _repin(old, OLD_PIN)
    return root


def test_lines_are_listed_and_picked_by_version(project):
    assert [(line.name, line.root) for line in lines_of(project)] == [
        (CURRENT, project), ("v0.19", project / "lines" / "v0.19")]
    assert line_for(project, "0.19.1").name == "v0.19"
    assert line_for(project, "0.20.0+vp.abc").name == CURRENT
    with pytest.raises(PinMismatch, match=r"there are: current \(vLLM 0.20.0\), v0.19 \(vLLM 0.19.1\)"):
        line_for(project, "0.33.0")
    assert nearest(project, "0.19.0") == "the nearest release a line covers is 0.19.1 (line v0.19)"
    assert nearest(project, "0.19.5+local") == ("the nearest releases a line covers are 0.19.1 (line v0.19) and "
                                                "0.20.0 (line current)")
    assert nearest(project, None) == nearest(project, "not-a-version") == ""
    with pytest.raises(InputError, match="no release line 'v0.18'"):
        line_named(project, "v0.18")
    with pytest.raises(InputError):
        line_named(project, "../x")


def test_a_target_gets_the_line_of_its_vllm(project, tree, tmp_path):
    old_tree = tmp_path / "old-tree"
    shutil.copytree(tree, old_tree)
    (old_tree / "vllm/_version.py").write_bytes(OLD_VERSION_PY)

    result = run_cli("--series", str(project), "apply", "--target", str(old_tree), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [p["name"] for p in data["patches"]] == ["0001-old-fix.patch"]
    assert any("release line v0.19" in n for n in data["notes"])
    assert b"return 22" in (old_tree / "vllm/b.py").read_bytes()

    result = run_cli("--series", str(project), "apply", "--target", str(tree), "--json")
    assert result.returncode == 0, result.stderr
    assert [p["name"] for p in json.loads(result.stdout)["patches"]] == ["0001-first-fix.patch",
                                                                         "0002-second-fix.patch"]


def test_line_option_and_refusals(project, tree, tmp_path):
    before = snapshot(tree)
    # --line chooses, before or after the command; a line pinned elsewhere is a pin mismatch.
    for args in (["--line", "v0.19", "apply"], ["apply", "--line", "v0.19"]):
        result = run_cli("--series", str(project), *args, "--target", str(tree))
        assert result.returncode == 2 and "0.19.1" in result.stderr, result.stderr
    unknown = run_cli("--series", str(project), "--line", "v0.18", "status", "--target", str(tree))
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        f"error: no release line 'v0.18' in {project}; there are: current (vLLM 0.20.0), v0.19 (vLLM 0.19.1)"]

    # A target no line is pinned to: one line naming the lines; --force takes the current line.
    new_tree = tmp_path / "new-tree"
    shutil.copytree(tree, new_tree)
    (new_tree / "vllm/_version.py").write_bytes(b"__version__ = version = '0.33.0'\n")
    refused = run_cli("--series", str(project), "apply", "--target", str(new_tree))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: no release line of this project is pinned to vLLM 0.33.0; the nearest release a line covers is "
        "0.20.0 (line current); there are: current (vLLM 0.20.0), v0.19 (vLLM 0.19.1); pass --line NAME --force "
        "to use one anyway"]
    assert snapshot(tree) == before
    forced = run_cli("--series", str(project), "apply", "--target", str(new_tree), "--force", "--dry-run",
                     "--json")
    assert forced.returncode == 0, forced.stderr
    assert any("release line current" in n for n in json.loads(forced.stdout)["notes"])


def test_series_and_check_take_the_line(project):
    shown = run_cli("--series", str(project), "--line", "v0.19", "series", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["pin"]["version"] == "0.19.1"
    assert [p["name"] for p in data["patches"]] == ["0001-old-fix.patch"]
    assert json.loads(run_cli("--series", str(project), "series", "--json").stdout)["pin"]["version"] == "0.20.0"


def test_authoring_takes_the_line(project, base_files, tmp_path, monkeypatch):
    """`new --line NAME` records the patch in lines/NAME, not in the top-level series."""
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    old_base = {**base_files, "vllm/_version.py": OLD_VERSION_PY}
    upstream = git_repo(tmp_path / "upstream", old_base, tag="v0.19.1")
    tree = tmp_path / "edited"
    write_tree(tree, {**old_base, "vllm/b.py": edit(base_files["vllm/b.py"], b"return 2\n", b"return 22\n")})
    write_tree(tree, {"vllm/a.py": edit(base_files["vllm/a.py"], b"line 15\n", b"line 15 line\n")})
    top_before = (project / "series").read_text()
    made = run_cli("--series", str(project), "--line", "v0.19", "new", "--from", str(tree), "--file", "vllm/a.py",
                   "--subject", "a line fix", "--upstream", str(upstream))
    assert made.returncode == 0, made.stderr
    assert (project / "series").read_text() == top_before
    assert "0002-a-line-fix.patch" in (project / "lines" / "v0.19" / "series").read_text()
    assert (project / "lines" / "v0.19" / "patches" / "0002-a-line-fix.patch").is_file()
    assert not (project / "patches" / "0002-a-line-fix.patch").exists()
    assert project_of(project / "lines" / "v0.19") == project and project_of(project) == project


def _declare(series_dir: Path, also: str) -> None:
    text = (series_dir / "series").read_text()
    (series_dir / "series").write_text(re.sub(r"(?m)^(#: wheel = .*)$", rf"\1\n#: also = {also}", text))


def _at_version(tree: Path, dest: Path, version: str) -> Path:
    shutil.copytree(tree, dest)
    (dest / "vllm/_version.py").write_bytes(f"__version__ = version = '{version}'\n".encode())
    return dest


def test_a_release_the_line_declares_gets_the_line_without_force(project, tree, tmp_path):
    """Line v0.19 declares 0.19.2 (``#: also``): a 0.19.2 target gets it for apply, status and revert."""
    _declare(project / "lines" / "v0.19", "0.19.2 0.19.3")
    later = _at_version(tree, tmp_path / "later", "0.19.2")
    assert line_for(project, "0.19.2").name == "v0.19"
    for command, before in (("apply", "applies"), ("status", "applied"), ("revert", "applied")):
        result = run_cli("--series", str(project), command, "--target", str(later), "--json")
        assert result.returncode == 0, (command, result.stderr)
        data = json.loads(result.stdout)
        assert [p["name"] for p in data["patches"]] == ["0001-old-fix.patch"], command
        assert {p["state"] for p in data["patches"]} == {before}, command
        assert any("release line v0.19" in n for n in data["notes"]), command
        digest = json.loads(run_cli("--series", str(project), "--line", "v0.19", "series", "--json").stdout)["digest"]
        assert data["series_from"] == f"series {digest} from {project / 'lines' / 'v0.19'}", command
    assert snapshot(later) == snapshot(_at_version(tree, tmp_path / "pristine", "0.19.2"))
    listed = run_cli("--series", str(project), "apply", "--target", str(_at_version(tree, tmp_path / "n", "0.33.0")))
    assert listed.returncode == 2
    assert "v0.19 (vLLM 0.19.1, 0.19.2, 0.19.3)" in listed.stderr


def test_status_on_a_vllm_no_line_covers_says_so_in_one_line(project, tree, tmp_path):
    """status chooses the line as apply does: no line for 0.19.2 is exit 2, not the current line's table."""
    for version in ("0.19.2", "0.33.0"):
        target = _at_version(tree, tmp_path / version, version)
        before = snapshot(target)
        result = run_cli("--series", str(project), "status", "--target", str(target))
        assert result.returncode == 2, result.stdout
        assert result.stdout == ""
        near = {"0.19.2": "the nearest releases a line covers are 0.19.1 (line v0.19) and 0.20.0 (line current)",
                "0.33.0": "the nearest release a line covers is 0.20.0 (line current)"}[version]
        assert result.stderr.strip().splitlines() == [
            f"error: no release line of this project is pinned to vLLM {version}; {near}; there are: current "
            "(vLLM 0.20.0), v0.19 (vLLM 0.19.1); pass --line NAME --force to use one anyway"]
        assert snapshot(target) == before
    # --line still chooses for status (a mismatch is then a note).
    chosen = run_cli("--series", str(project), "--line", "current", "status", "--target", str(tmp_path / "0.33.0"))
    assert chosen.returncode == 0, chosen.stderr


@pytest.mark.parametrize("breakage", ["malformed", "dev-zero"])
def test_a_broken_line_only_affects_choices_that_need_it(project, tree, tmp_path, breakage):
    """A malformed lines/v0.19/series: a target of the current line still gets its line; a target
    the broken line might cover is refused in one line naming the file."""
    broken = project / "lines" / "v0.19" / "series"
    if breakage == "malformed":
        broken.write_text(broken.read_text().replace("#: tag = v0.19.1", "#: tag v0.19.1"))
    else:
        broken.unlink()
        broken.symlink_to("/dev/zero")
    assert line_for(project, "0.20.0").name == CURRENT
    result = run_cli("--series", str(project), "apply", "--target", str(tree), "--json")
    assert result.returncode == 0, result.stderr
    assert [p["name"] for p in json.loads(result.stdout)["patches"]] == ["0001-first-fix.patch",
                                                                         "0002-second-fix.patch"]
    old = _at_version(tree, tmp_path / "old", "0.19.1")
    before = snapshot(old)
    for command in ("apply", "status", "revert"):
        refused = run_cli("--series", str(project), command, "--target", str(old))
        assert refused.returncode == 2, (command, refused.stdout)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: cannot choose a release line for vLLM 0.19.1: "), lines
        assert str(broken) in lines[0], lines
    assert snapshot(old) == before


def test_a_directory_without_a_series_says_so(tree, tmp_path):
    result = run_cli("--series", str(tmp_path / "nothing"), "status", "--target", str(tree))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: no series file at {tmp_path / 'nothing' / 'series'}"]
