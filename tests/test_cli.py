"""The CLI on bad input: one clear line, the documented exit code, no byte changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import make_site_packages, snapshot
from vllm_patch.cli import main


def run(series: Path, *args: str):
    return CliRunner().invoke(main, ["--series", str(series), *args])


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def first_patch(series: Path) -> Path:
    return sorted((series / "patches").glob("*.patch"))[0]


def corrupt(series: Path, old: bytes, new: bytes) -> None:
    p = first_patch(series)
    data = p.read_bytes()
    assert old in data
    p.write_bytes(data.replace(old, new, 1))


BAD_PATCHES = {
    "malformed hunk header": (b"@@ -7,7 +7,7 @@", b"@@ -7,7 +7,x @@", "malformed hunk header"),
    "wrong line counts": (b"@@ -7,7 +7,7 @@", b"@@ -7,9 +7,9 @@", "malformed diff"),
    "absolute path": (b"vllm/b.py", b"/etc/b.py", "unsafe path"),
    "dotdot path": (b"vllm/b.py", b"../b.py", "unsafe path"),
    "binary": (b"--- /dev/null\n+++ b/vllm/new_kernel.py\n@@ -0,0 +1 @@\n+KERNEL = 1\n",
               b"GIT binary patch\nliteral 3\nKcmZ>Y%K!iX\n\n", "binary"),
}


@pytest.mark.parametrize("case", sorted(BAD_PATCHES))
def test_bad_patch_files(case, tree, two_patch_series):
    old, new, message = BAD_PATCHES[case]
    if "path" in case:
        p = first_patch(two_patch_series)
        p.write_bytes(p.read_bytes().replace(b"a/" + old, b"a/" + new).replace(b"b/" + old, b"b/" + new))
    else:
        corrupt(two_patch_series, old, new)
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree))
    assert result.exit_code == 2, result.output
    assert len(error_lines(result)) == 1 and message in error_lines(result)[0]
    assert snapshot(tree) == before


def test_truncated_patch(tree, two_patch_series):
    p = first_patch(two_patch_series)
    p.write_bytes(p.read_bytes()[:-80])
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree))
    assert result.exit_code == 2 and "truncated" in error_lines(result)[0]
    assert snapshot(tree) == before


def test_empty_patch(tree, two_patch_series):
    first_patch(two_patch_series).write_bytes(b"")
    result = run(two_patch_series, "status", "--target", str(tree))
    assert result.exit_code == 2 and "empty patch" in error_lines(result)[0]


@pytest.mark.parametrize(("line", "message"), [("0009-missing.patch", "does not exist"),
                                               ("0001-first-fix.patch", "listed twice")])
def test_bad_series_entries(tree, two_patch_series, line, message):
    with open(two_patch_series / "series", "a") as fh:
        fh.write(line + "\n")
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree))
    assert result.exit_code == 2 and message in error_lines(result)[0]
    assert snapshot(tree) == before


def test_symlink_leading_outside(tmp_path, tree, two_patch_series):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "b.py").write_bytes((tree / "vllm/b.py").read_bytes())
    (tree / "vllm/b.py").unlink()
    (tree / "vllm/b.py").symlink_to(outside / "b.py")
    before, outside_before = snapshot(tree), snapshot(outside)
    result = run(two_patch_series, "apply", "--target", str(tree))
    assert result.exit_code == 2 and "symlink leading outside" in error_lines(result)[0]
    assert snapshot(tree) == before and snapshot(outside) == outside_before


def test_non_utf8_target_file(tree, two_patch_series):
    (tree / "vllm/b.py").write_bytes(b"def f():\n    return '\xe9'\n")
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree))
    assert result.exit_code == 2 and "not UTF-8" in error_lines(result)[0]
    assert snapshot(tree) == before


def test_read_only_target(tree, two_patch_series):
    os.chmod(tree / "vllm/b.py", 0o444)
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree))
    assert result.exit_code == 2 and "read-only" in error_lines(result)[0]
    assert snapshot(tree) == before


def test_version_and_commit_mismatch(tmp_path, base_files, two_patch_series):
    site = make_site_packages(tmp_path / "site", base_files, version="0.19.1")
    before = snapshot(site)
    result = run(two_patch_series, "apply", "--target", str(site))
    assert result.exit_code == 2
    assert "0.19.1" in error_lines(result)[0] and "--force" in error_lines(result)[0]
    assert snapshot(site) == before


def test_conflict_exits_1_and_names_the_hunk(tree, two_patch_series):
    (tree / "vllm/b.py").write_bytes(b"def f():\n    return 5\n")
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree), "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["verdict"] == "failed" and data["patches"][0]["state"] == "conflict"
    assert any("vllm/b.py hunk 1" in p for p in data["patches"][0]["problems"])
    assert snapshot(tree) == before


def test_json_and_status_expect(tree, two_patch_series):
    result = run(two_patch_series, "status", "--target", str(tree), "--expect", "applied")
    assert result.exit_code == 1 and "expected every patch applied" in result.stdout
    result = run(two_patch_series, "apply", "--target", str(tree), "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["changed"] == ["vllm/a.py", "vllm/b.py", "vllm/new_kernel.py"]
    result = run(two_patch_series, "status", "--target", str(tree), "--expect", "applied", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["verdict"] == "applied"


def test_missing_target_is_a_usage_error(two_patch_series):
    result = run(two_patch_series, "apply")
    assert result.exit_code == 2
    result = run(two_patch_series, "apply", "--target", "/nonexistent/dir")
    assert result.exit_code == 2 and "not a directory" in error_lines(result)[0]


def test_check_against_a_given_base(tree, two_patch_series):
    result = run(two_patch_series, "check", "--base", str(tree))
    assert result.exit_code == 0, result.output
    assert "apply cleanly" in result.stdout
    (tree / "vllm/dup.py").write_bytes((tree / "vllm/a.py").read_bytes().replace(b"line 11\n", b"line 11\n"))
    (tree / "vllm/a.py").write_bytes((tree / "vllm/a.py").read_bytes() * 2)
    result = run(two_patch_series, "check", "--base", str(tree), "--json")
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["patches"][0]["problems"]
    assert any("ambiguous" in p and "lines 7, 47" in p for p in problems), problems


def test_series_command(two_patch_series):
    result = run(two_patch_series, "series", "--json")
    data = json.loads(result.stdout)
    assert data["pin"]["version"] == "0.20.0" and len(data["patches"]) == 2
    assert data["patches"][0]["trailers"]["Origin"] == "vendor"


def test_concurrent_run_fails_with_a_clear_message(tree, two_patch_series):
    import subprocess
    import sys
    hold = ("import sys, time\nfrom pathlib import Path\nfrom vllm_patch.locking import target_lock\n"
            "with target_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(5)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tree)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(tree)
        result = run(two_patch_series, "apply", "--target", str(tree), "--wait", "0.2")
        assert result.exit_code == 2 and "another vllm-patch run is working on" in error_lines(result)[0]
        assert snapshot(tree) == before
    finally:
        holder.kill()
        holder.wait()
