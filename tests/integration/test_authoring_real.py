"""refresh, new and import on the real vLLM 0.20.0 (pinned base from the cached sdist)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import git, git_repo, run_cli, snapshot
from realvllm import GDN, RUNNER, ambiguous_steps, make_series, sample_series_steps
from vllm_patch.engine.analysis import analyze, touched
from vllm_patch.series import load_series

pytestmark = pytest.mark.integration


def tree_with(sdist_tree: Path, dest: Path, series_dir: Path, upto: int, paths: list[str]) -> Path:
    """`paths` of the base with the first `upto` patches applied, in a small tree."""
    series = load_series(series_dir)
    patches = list(series.patches)[:upto]
    files = {p: (sdist_tree / p).read_bytes() for p in dict.fromkeys([*touched(patches), *paths])
             if (sdist_tree / p).exists()}
    files.update({p: d for p, d in analyze(patches, files).patched.items() if d is not None})
    for rel, data in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    return dest


@pytest.fixture
def series_dir(sdist_tree, tmp_path) -> Path:
    base, steps = sample_series_steps(sdist_tree)
    return make_series(tmp_path / "series", base, steps)


def test_refresh_without_edit_changes_no_byte_and_with_edit_keeps_the_header(series_dir, sdist_tree, tmp_path):
    name = "0002-GDN-test-metadata-field.patch"
    tree = tree_with(sdist_tree, tmp_path / "t", series_dir, 2, [GDN])
    before = snapshot(series_dir)
    result = run_cli("--series", str(series_dir), "refresh", name, "--from", str(tree))
    assert result.returncode == 0, result.stderr
    assert snapshot(series_dir) == before
    gdn = tree / GDN
    gdn.write_text(gdn.read_text().replace("# vllm-patch test\n", "# vllm-patch test, refreshed\n"))
    assert run_cli("--series", str(series_dir), "refresh", name, "--from", str(tree)).returncode == 0
    text = (series_dir / "patches" / name).read_text()
    assert "+    spec_decode_src_indices: torch.Tensor | None = None  # vllm-patch test, refreshed" in text
    assert "Subject: [PATCH] GDN: test metadata field" in text and "Origin: vendor" in text
    assert run_cli("--series", str(series_dir), "check").returncode == 0


def test_refresh_unique_widens_an_ambiguous_hunk_at_the_same_place(sdist_tree, tmp_path):
    base, steps = ambiguous_steps(sdist_tree)
    series_dir = make_series(tmp_path / "amb", base, steps)
    name = load_series(series_dir).names[0]
    tree = tmp_path / "t"
    (tree / RUNNER).parent.mkdir(parents=True)
    (tree / RUNNER).write_bytes(steps[0][1][RUNNER])
    plain = run_cli("--series", str(series_dir), "refresh", name, "--from", str(tree))
    assert plain.returncode == 1 and "--unique" in plain.stderr
    assert run_cli("--series", str(series_dir), "refresh", name, "--from", str(tree), "--unique").returncode == 0
    check = json.loads(run_cli("--series", str(series_dir), "check", "--json").stdout)
    assert check["ok"] and check["patches"][0]["state"] == "applies"
    hunk = check["patches"][0]["hunks"][0]
    assert len(hunk["anchor_at"]) == 1 and 2490 <= hunk["anchor_at"][0] <= 2495
    patched = analyze(list(load_series(series_dir).patches), {RUNNER: base[RUNNER]}).patched[RUNNER]
    assert patched == steps[0][1][RUNNER]


def test_new_patch_from_edited_files(series_dir, sdist_tree, tmp_path):
    tree = tree_with(sdist_tree, tmp_path / "t", series_dir, 4, [GDN])
    gdn = tree / GDN
    gdn.write_text(gdn.read_text().replace("# vllm-patch test\n", "# vllm-patch test\n    new_field: int = 0\n"))
    result = run_cli("--series", str(series_dir), "new", "--from", str(tree), "--file", GDN, "--subject",
                     "GDN: a new field", "--origin", "https://github.com/vllm-project/vllm/pull/1", "--json")
    assert result.returncode == 0, result.stderr
    name = json.loads(result.stdout)["patch"]
    assert name == "0005-GDN-a-new-field.patch"
    series = load_series(series_dir)
    assert series.names[-1] == name
    assert series.patches[-1].trailer("Origin") == "https://github.com/vllm-project/vllm/pull/1"
    assert run_cli("--series", str(series_dir), "check").returncode == 0


def test_import_a_diff_and_a_commit_range(series_dir, sdist_tree, tmp_path):
    repo = git_repo(tmp_path / "repo", {GDN: (sdist_tree / GDN).read_bytes()})
    gdn = repo / GDN
    gdn.write_text(gdn.read_text().replace("    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n",
                                           "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n"
                                           "    imported_a: int = 0\n", 1))
    git(repo, "commit", "-q", "-am", "GDN: imported A\n\nFrom a PR.")
    (tmp_path / "pr.diff").write_bytes(git(repo, "diff", "HEAD~1", "HEAD"))
    result = run_cli("--series", str(series_dir), "import", str(tmp_path / "pr.diff"), "--subject", "GDN: from a diff",
                     "--bug", "https://github.com/vllm-project/vllm/issues/2")
    assert result.returncode == 1  # its anchor is patch 2's line, changed by the series: refused
    assert "does not apply uniquely" in result.stderr
    series_file = series_dir / "series"
    series_file.write_text(series_file.read_text().replace("0002-GDN-test-metadata-field.patch\n", ""))
    result = run_cli("--series", str(series_dir), "import", str(tmp_path / "pr.diff"), "--subject", "GDN: from a diff",
                     "--bug", "https://github.com/vllm-project/vllm/issues/2")
    assert result.returncode == 0, result.stderr
    imported = load_series(series_dir).patches[-1]
    assert imported.subject == "GDN: from a diff" and imported.trailer("Bug").endswith("/issues/2")
    (series_dir / "patches" / imported.name).unlink()
    series_file.write_text(series_file.read_text().replace(imported.name + "\n", ""))
    result = run_cli("--series", str(series_dir), "import", "HEAD~1..HEAD", "--repo", str(repo))
    assert result.returncode == 0, result.stderr
    last = load_series(series_dir).patches[-1]
    assert last.subject == "GDN: imported A" and "From a PR." in last.description
    check = run_cli("--series", str(series_dir), "check", "--json")
    assert check.returncode == 0, check.stdout
