"""Rebase a series from the real vLLM 0.20.0 to the real 0.21.0 (both PyPI sdists)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import git, run_cli, snapshot
from realvllm import CONV, make_series, rebase_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def rebase_series(sdist_tree, tmp_path) -> Path:
    base, steps = rebase_steps(sdist_tree)
    return make_series(tmp_path / "series", base, steps)


def resolve_taking_ours(work: Path) -> None:
    path = work / CONV
    text = re.sub(r"<<<<<<< [^\n]*\n.*?=======\n(.*?)>>>>>>> [^\n]*\n", r"\1", path.read_text(), flags=re.S)
    path.write_text(text)


def test_rebase_to_0_21_clean_merged_upstreamed_conflict_then_continue(rebase_series):
    s = ("--series", str(rebase_series))
    before = snapshot(rebase_series)
    first = run_cli(*s, "rebase", "v0.21.0", "--json")
    assert first.returncode == 1, first.stderr
    data = json.loads(first.stdout)
    assert [p["step"] for p in data["patches"]] == ["clean", "merged", "upstreamed", "conflict"]
    assert data["patches"][3]["conflicts"] == [CONV]
    assert "rebase --continue" in first.stderr
    assert {k: v for k, v in snapshot(rebase_series).items() if not k.startswith(".vllm-patch-rebase")} == before
    work = Path(data["work_dir"])
    assert "<<<<<<< v0.21.0 (new base)" in (work / CONV).read_text()

    # The new pin was looked up when the rebase started: going on needs no index.
    offline = {"VLLM_PATCH_INDEX_URL": "http://127.0.0.1:9/simple"}
    still = run_cli(*s, "rebase", "--continue", env=offline)
    assert still.returncode == 2 and "conflict markers remain" in still.stderr

    resolve_taking_ours(work)
    done = run_cli(*s, "rebase", "--continue", "--json", env=offline)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["done"] and result["pin"]["version"] == "0.21.0"
    assert [p["step"] for p in result["patches"]] == ["clean", "merged", "upstreamed", "merged"]
    series_text = (rebase_series / "series").read_text()
    assert "#: version = 0.21.0" in series_text and "0003-conv1d-upstreamed-rebase-test.patch" not in series_text
    assert not (rebase_series / "patches/0003-conv1d-upstreamed-rebase-test.patch").exists()
    assert "Applied-Upstream: v0.21.0" in (rebase_series / "dropped-patches").read_text()
    merged = (rebase_series / "patches/0002-conv1d-merge-rebase-test.patch").read_text()
    assert "-    stride_w_width: tl.constexpr,  # stride to get to next width-axis value\n" in merged
    assert " stride_x_token: tl.int64," in merged  # the new base's line is now context
    assert "Origin: vendor" in merged and "From: Test Author <author@example.org>" in merged
    resolved = (rebase_series / "patches/0004-conv1d-conflict-rebase-test.patch").read_text()
    assert "+    stride_o_token: tl.int32," in resolved
    check = run_cli(*s, "check", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["found"]["version"] == "0.21.0"


def test_abort_leaves_the_series_as_it_was(rebase_series):
    s = ("--series", str(rebase_series))
    before = snapshot(rebase_series)
    assert run_cli(*s, "rebase", "v0.21.0").returncode == 1
    aborted = run_cli(*s, "rebase", "--abort")
    assert aborted.returncode == 0 and "aborted" in aborted.stdout
    assert snapshot(rebase_series) == before and not (rebase_series / ".vllm-patch-rebase").exists()


def test_interrupted_final_write_is_rolled_back(rebase_series):
    s = ("--series", str(rebase_series))
    # Drop the conflicting patch so the rebase runs to its final write.
    series_file = rebase_series / "series"
    series_file.write_text(series_file.read_text().replace("0004-conv1d-conflict-rebase-test.patch\n", ""))
    before = snapshot(rebase_series)
    killed = run_cli(*s, "rebase", "v0.21.0", env={"VLLM_PATCH_FAULT_AFTER_WRITES": "2"})
    assert killed.returncode == -9
    assert snapshot(rebase_series) != before
    again = run_cli(*s, "rebase", "--abort")
    assert "rolled back" in again.stderr
    assert {k: v for k, v in snapshot(rebase_series).items()} == before


@pytest.mark.parametrize(("tag", "message"), [("v99.0.0", "cannot get vLLM v99.0.0"), ("latest", "unknown tag")])
def test_unknown_tags(rebase_series, tag, message):
    before = snapshot(rebase_series)
    result = run_cli("--series", str(rebase_series), "rebase", tag)
    assert result.returncode == 2 and message in result.stderr
    assert snapshot(rebase_series) == before


def test_continue_without_a_rebase(rebase_series):
    result = run_cli("--series", str(rebase_series), "rebase", "--continue")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: no rebase in progress for the series in {rebase_series} (a rebase started with --series DIR or "
        "--line NAME needs the same option with --continue and --abort)"]


def checkout_at_0_20(sdist_tree: Path, tmp_path: Path) -> Path:
    """A git checkout of the 0.20.0 sdist's files, tagged v0.20.0, for rebases with --repo."""
    repo = tmp_path / "vllm-git"
    shutil.copytree(sdist_tree, repo, symlinks=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A", "-f")
    git(repo, "commit", "-q", "-m", "0.20.0")
    git(repo, "tag", "v0.20.0")
    return repo


def test_a_tag_with_no_release_on_the_index_stops_before_any_patch_is_ported(rebase_series, sdist_tree,
                                                                             tmp_path):
    repo = checkout_at_0_20(sdist_tree, tmp_path)
    # Patch 4 conflicts with this commit: without the lookup first, the rebase would stop there and
    # ask for a resolution whose --continue could never finish.
    conv = repo / CONV
    conv.write_text(conv.read_text().replace("stride_o_token", "stride_out_token"))
    version = repo / "vllm/_version.py"
    version.write_text(version.read_text().replace("'0.20.0'", "'0.99.0'").replace("(0, 20, 0)", "(0, 99, 0)"))
    git(repo, "commit", "-q", "-am", "next")
    git(repo, "tag", "v0.99.0")
    before = snapshot(rebase_series)
    result = run_cli("--series", str(rebase_series), "rebase", "v0.99.0", "--repo", str(repo))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "vllm-0.99.0.tar.gz is not on" in result.stderr
    assert snapshot(rebase_series) == before and not (rebase_series / ".vllm-patch-rebase").exists()


def test_rebase_from_a_local_git_checkout(rebase_series, sdist_tree, tmp_path):
    repo = checkout_at_0_20(sdist_tree, tmp_path)
    series_file = rebase_series / "series"
    series_file.write_text(series_file.read_text().replace("0004-conv1d-conflict-rebase-test.patch\n", ""))
    # A "next release" that only upstreams patch 3's change.
    conv = repo / CONV
    conv.write_text(conv.read_text().replace("    stride_x_token: tl.constexpr,  # stride to get to next token (same",
                                             "    stride_x_token: tl.int64,  # stride to get to next token (same"))
    git(repo, "commit", "-q", "-am", "next")
    git(repo, "tag", "v0.21.0")
    result = run_cli("--series", str(rebase_series), "rebase", "v0.21.0", "--repo", str(repo), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [p["step"] for p in data["patches"]] == ["clean", "merged", "upstreamed"]
    assert data["pin"]["commit"] == git(repo, "rev-parse", "v0.21.0").decode().strip()


def test_a_carried_patch_stays_a_reference_while_it_ports_unchanged(rebase_series, tmp_path):
    """A line carrying the current line's patches (``NAME from current``) rebased to 0.21.0: a patch that applies
    to the new base as it is (clean) stays a reference to the current line's file; one the port had to change
    (merged with the new base) becomes the line's own file."""
    project = tmp_path / "project"
    shutil.copytree(rebase_series, project)
    names = [n for n in (project / "series").read_text().splitlines() if n and not n.startswith("#")]
    line = project / "lines" / "old"
    (line / "patches").mkdir(parents=True)
    text = (project / "series").read_text()
    for name in names[:2]:
        text = text.replace(f"{name}\n", f"{name} from current\n")
    for name in names[2:]:
        shutil.copyfile(project / "patches" / name, line / "patches" / name)
    (line / "series").write_text(text)
    first = run_cli("--series", str(line), "rebase", "v0.21.0", "--json")
    assert first.returncode == 1, first.stderr
    resolve_taking_ours(Path(json.loads(first.stdout)["work_dir"]))
    done = run_cli("--series", str(line), "rebase", "--continue", "--json",
                   env={"VLLM_PATCH_INDEX_URL": "http://127.0.0.1:9/simple"})
    assert done.returncode == 0, done.stderr
    steps = {p["name"]: p["step"] for p in json.loads(done.stdout)["patches"]}
    entries = [n for n in (line / "series").read_text().splitlines() if n and not n.startswith("#")]
    clean, merged = names[:2]
    assert steps[clean] == "clean" and steps[merged] == "merged"
    unchanged = (project / "patches" / clean).read_bytes()
    assert f"{clean} from current" in entries and not (line / "patches" / clean).exists()
    assert merged in entries and (line / "patches" / merged).is_file()
    assert (project / "patches" / clean).read_bytes() == unchanged  # the current line's file is never written
    assert run_cli("--series", str(line), "check").returncode == 0
