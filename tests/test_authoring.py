"""import and refresh on small synthetic trees: the pinned base is a local git repository
(``--upstream``), the cache a temporary directory (the real vLLM: tests/integration)."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import git, git_repo, snapshot, write_tree
from vllm_patch import operations
from vllm_patch.cli import main
from vllm_patch.series import load_series
from vllm_patch.targets.tree import TreeTarget


@pytest.fixture
def upstream(tmp_path, base_files, monkeypatch) -> Path:
    """The pinned base as a git repository tagged v0.20.0, and a private cache."""
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    return git_repo(tmp_path / "upstream", base_files, tag="v0.20.0")


def run(series: Path, upstream: Path, *args: str):
    return CliRunner().invoke(main, ["--series", str(series), *args, "--upstream", str(upstream)])


def errors(result) -> list[str]:
    assert "Traceback" not in result.output, result.output
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def edit_line(data: bytes, old: str, new: str) -> bytes:
    assert data.count(old.encode()) == 1
    return data.replace(old.encode(), new.encode())


def unified(old: bytes, new: bytes, a: str, b: str) -> str:
    return "".join(difflib.unified_diff(old.decode().splitlines(True), new.decode().splitlines(True), a, b))


def applied_tree(tmp_path: Path, base_files, series_dir: Path) -> Path:
    root = tmp_path / "applied"
    write_tree(root, dict(base_files))
    assert operations.apply(TreeTarget(root), load_series(series_dir)).ok
    return root


def test_import_of_a_commit_range_strips_the_patch_tags(tmp_path, base_files, two_patch_series, upstream):
    repo = git_repo(tmp_path / "work", base_files)
    a = base_files["vllm/a.py"]
    a1 = edit_line(a, "line 15\n", "line 15 first\n")
    write_tree(repo, {"vllm/a.py": a1})
    git(repo, "commit", "-q", "-am", "GDN: first import\n\nThe first.")
    write_tree(repo, {"vllm/a.py": edit_line(a1, "line 35\n", "line 35 second\n")})
    git(repo, "commit", "-q", "-am", "GDN: second import")
    result = run(two_patch_series, upstream, "import", "HEAD~2..HEAD", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    series = load_series(two_patch_series)
    assert list(series.names[2:]) == ["0003-GDN-first-import.patch", "0004-GDN-second-import.patch"]
    assert [p.subject for p in series.patches[2:]] == ["GDN: first import", "GDN: second import"]
    assert "The first." in series.patches[2].description


def test_import_decodes_rfc2047_headers(tmp_path, base_files, two_patch_series, upstream):
    a = base_files["vllm/a.py"]
    diff = git_style(a, edit_line(a, "line 20\n", "line 20 caf\u00e9\n"), "vllm/a.py")
    mail = ("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            "From: =?UTF-8?q?J=C3=B6rg_M=C3=BCller?= <jm@example.org>\n"
            "Date: Sun, 1 Nov 2026 12:00:00 +0000\n"
            "Subject: [PATCH v2 3/7] =?UTF-8?q?caf=C3=A9=3A_a_fix?=\n\nWhy.\n---\n" + diff)
    (tmp_path / "m.patch").write_text(mail)
    result = run(two_patch_series, upstream, "import", str(tmp_path / "m.patch"))
    assert result.exit_code == 0, result.output
    patch = load_series(two_patch_series).patches[-1]
    assert patch.name == "0003-caf\u00e9-a-fix.patch"
    assert patch.subject == "caf\u00e9: a fix" and patch.author == "J\u00f6rg M\u00fcller <jm@example.org>"


def git_style(old: bytes, new: bytes, rel: str) -> str:
    return f"diff --git a/{rel} b/{rel}\n" + unified(old, new, f"a/{rel}", f"b/{rel}")


def test_import_of_a_plain_unified_diff(tmp_path, base_files, two_patch_series, upstream):
    a = base_files["vllm/a.py"]
    a_new = edit_line(a, "line 20\n", "line 20 plain\n")
    text = ("Index: vllm/a.py\n" + "=" * 67 + "\n" + unified(a, a_new, "a/vllm/a.py", "b/vllm/a.py")
            + "--- /dev/null\n+++ b/vllm/plainpkg/__init__.py\n@@ -0,0 +1 @@\n+X = 1\n")
    (tmp_path / "plain.diff").write_text(text)
    result = run(two_patch_series, upstream, "import", str(tmp_path / "plain.diff"), "--subject", "A plain diff")
    assert result.exit_code == 0, result.output
    series = load_series(two_patch_series)
    patch = series.patches[-1]
    assert patch.name == "0003-A-plain-diff.patch" and patch.paths == ("vllm/a.py", "vllm/plainpkg/__init__.py")
    assert b"diff --git a/vllm/a.py b/vllm/a.py" in patch.raw and b"new file mode 100644" in patch.raw
    tree = applied_tree(tmp_path, base_files, two_patch_series)
    assert b"line 20 plain\n" in (tree / "vllm/a.py").read_bytes()
    assert (tree / "vllm/plainpkg/__init__.py").read_bytes() == b"X = 1\n"


def test_import_of_a_diff_ruN(tmp_path, base_files, two_patch_series, upstream):
    """GNU diff -ruN between two trees: any first path component, timestamps, new files dated at the epoch."""
    b = base_files["vllm/b.py"]
    b_new = edit_line(b, "return 2\n", "return 2  # from diff -ruN\n")
    body = unified(b, b_new, "vllm-0.20.0.orig/vllm/b.py\t2026-11-01 12:00:00.000000000 +0000",
                   "vllm-0.20.0/vllm/b.py\t2026-11-02 12:00:00.000000000 +0000")
    body += ("diff -ruN vllm-0.20.0.orig/vllm/ruN.py vllm-0.20.0/vllm/ruN.py\n"
             "--- vllm-0.20.0.orig/vllm/ruN.py\t1970-01-01 00:00:00.000000000 +0000\n"
             "+++ vllm-0.20.0/vllm/ruN.py\t2026-11-02 12:00:00.000000000 +0000\n@@ -0,0 +1,2 @@\n+A = 1\n+B = 2\n")
    (tmp_path / "ruN.diff").write_text("diff -ruN vllm-0.20.0.orig/vllm/b.py vllm-0.20.0/vllm/b.py\n" + body)
    result = run(two_patch_series, upstream, "import", str(tmp_path / "ruN.diff"), "--subject", "From diff -ruN")
    assert result.exit_code == 0, result.output
    assert load_series(two_patch_series).patches[-1].paths == ("vllm/b.py", "vllm/ruN.py")
    tree = applied_tree(tmp_path, base_files, two_patch_series)
    assert (tree / "vllm/ruN.py").read_bytes() == b"A = 1\nB = 2\n"


@pytest.mark.parametrize(("old", "new", "message"), [
    ("a/../vllm/a.py", "b/../vllm/a.py", "unsafe path"),
    ("a/vllm/.git/config", "b/vllm/.git/config", "unsafe path"),
    ("/vllm/a.py", "/vllm/a.py", "unsafe path"),
    ("a.py", "a.py", "no leading directory"),
    ("a/vllm/a.py", "b/vllm/b.py", "differ"),
])
def test_import_of_a_plain_diff_keeps_the_safety_checks(tmp_path, base_files, two_patch_series, upstream,
                                                        old, new, message):
    a = base_files["vllm/a.py"]
    (tmp_path / "bad.diff").write_text(unified(a, edit_line(a, "line 20\n", "line 20 x\n"), old, new))
    before = snapshot(two_patch_series)
    result = run(two_patch_series, upstream, "import", str(tmp_path / "bad.diff"), "--subject", "Bad")
    assert result.exit_code == 2, result.output
    assert len(errors(result)) == 1 and message in errors(result)[0]
    assert snapshot(two_patch_series) == before


def test_import_of_a_diff_with_a_nul_byte_is_refused(tmp_path, base_files, two_patch_series, upstream):
    a = base_files["vllm/a.py"]
    (tmp_path / "nul.diff").write_text(git_style(a, edit_line(a, "line 20\n", "line 20 \x00\n"), "vllm/a.py"))
    before = snapshot(two_patch_series)
    result = run(two_patch_series, upstream, "import", str(tmp_path / "nul.diff"), "--subject", "NUL")
    assert result.exit_code == 2 and "NUL byte" in errors(result)[0]
    assert snapshot(two_patch_series) == before


def test_import_of_a_diff_whose_anchor_is_gone_names_the_nearest_text(tmp_path, base_files, two_patch_series,
                                                                      upstream):
    a = base_files["vllm/a.py"]
    other = edit_line(a, "line 19\n", "line 19 on other sources\n")
    (tmp_path / "pr.diff").write_text(git_style(other, edit_line(other, "line 20\n", "line 20 x\n"), "vllm/a.py"))
    before = snapshot(two_patch_series)
    result = run(two_patch_series, upstream, "import", str(tmp_path / "pr.diff"), "--subject", "Elsewhere")
    assert result.exit_code == 1, result.output
    (line,) = errors(result)
    assert "anchor not found: the nearest similar text" in line and "starts at line 17" in line
    assert "line 19 there reads 'line 19' where the hunk expects 'line 19 on other sources'" in line
    assert "more context" not in line and "-U10" not in line
    assert snapshot(two_patch_series) == before


def test_git_failure_in_the_patch_writer_is_one_line(tmp_path, base_files, two_patch_series, upstream):
    """A hand-edited Date: header that git cannot read: refresh fails cleanly, changing nothing."""
    name = "0002-second-fix.patch"
    path = two_patch_series / "patches" / name
    text = path.read_text()
    date = next(line for line in text.splitlines() if line.startswith("Date: "))
    path.write_text(text.replace(date, "Date: the day after tomorrow"))
    tree = applied_tree(tmp_path, base_files, two_patch_series)
    (tree / "vllm/a.py").write_bytes(edit_line((tree / "vllm/a.py").read_bytes(), "line 30b added\n",
                                               "line 30b edited\n"))
    before = snapshot(two_patch_series)
    result = run(two_patch_series, upstream, "refresh", name, "--from", str(tree))
    assert result.exit_code == 2, (result.output, result.exception)
    (line,) = errors(result)
    assert "git failed" in line and "invalid date format" in line
    assert snapshot(two_patch_series) == before


def test_a_patch_to_an_executable_file_keeps_its_mode(tmp_path, base_files, two_patch_series, monkeypatch):
    """vLLM ships executable .py files (vllm/envs.py): a patch to one records the file's mode, 100755, and no
    mode change, so that a later rebase regenerates it without one (a mode change is refused)."""
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "upstream"
    write_tree(repo, dict(base_files))
    (repo / "vllm" / "b.py").chmod(0o755)
    git_repo(repo, {}, tag="v0.20.0")
    assert b"100755" in git(repo, "ls-files", "-s", "vllm/b.py")
    tree = applied_tree(tmp_path, base_files, two_patch_series)
    path = tree / "vllm" / "b.py"
    path.write_bytes(path.read_bytes() + b"\n\ndef h():\n    return 3\n")
    result = run(two_patch_series, repo, "new", "--from", str(tree), "--file", "vllm/b.py", "--subject", "Exec")
    assert result.exit_code == 0, result.output
    text = next((two_patch_series / "patches").glob("0003-*.patch")).read_text()
    assert "old mode" not in text and "new mode" not in text
    header = text[text.index("diff --git a/vllm/b.py"):].splitlines()[1]
    assert header.startswith("index ") and header.endswith(" 100755"), header
