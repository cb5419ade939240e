"""The CLI on bad input: one clear line, the documented exit code, no byte changed."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import make_site_packages, snapshot
from vllm_patch import operations
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


def test_a_full_disk_names_the_file_and_says_nothing_was_changed(tree, two_patch_series, monkeypatch):
    """ENOSPC while the second file is written (a write that fails carries no file name): the one line names
    the file, says the disk is full and that nothing was changed, and the first file is rolled back."""
    from vllm_patch.infrastructure import transaction

    real, writes = transaction.atomic_write, []

    def full_disk(path, data, *args, **kwargs):
        if transaction.JOURNAL_DIR not in str(path):
            writes.append(path)
            if len(writes) == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(transaction, "atomic_write", full_disk)
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree))
    assert result.exit_code == 2, result.output
    [line] = error_lines(result)
    assert str(writes[1]) in line and "No space left on device" in line and "nothing was changed" in line
    assert snapshot(tree) == before


def test_version_and_commit_mismatch(tmp_path, base_files, two_patch_series):
    site = make_site_packages(tmp_path / "site", base_files, version="0.19.1")
    before = snapshot(site)
    result = run(two_patch_series, "apply", "--target", str(site))
    assert result.exit_code == 2
    assert "0.19.1" in error_lines(result)[0] and "--force" in error_lines(result)[0]
    assert snapshot(site) == before


def test_conflict_exits_1_and_names_the_hunk(tree, two_patch_series):
    (tree / "vllm/b.py").write_bytes((tree / "vllm/b.py").read_bytes().replace(b"return 1", b"return 5"))
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree), "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["verdict"] == "failed" and data["patches"][0]["state"] == "conflict"
    assert any("vllm/b.py hunk 1" in p for p in data["patches"][0]["problems"])
    assert snapshot(tree) == before
    # The message shows what stands where the anchor was expected.
    (problem,) = [p for p in data["patches"][0]["problems"] if "vllm/b.py" in p]
    assert "anchor not found: the nearest similar text" in problem
    assert "line 2 there reads '    return 5' where the hunk expects '    return 1'" in problem


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
    hold = ("import sys, time\nfrom pathlib import Path\nfrom vllm_patch.infrastructure.locking import target_lock\n"
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


# --- The error contract: every failure a user can cause is one line and exit 2, never a traceback.

def one_error_line(result, *words: str) -> str:
    """The single 'error:' line of a failed run, with no traceback anywhere."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output, result.output
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.mark.parametrize("command", ["status", "apply"])
def test_malformed_record_line_is_one_line_exit_2(tmp_path, base_files, two_patch_series, command):
    site = make_site_packages(tmp_path / "site", base_files)
    record = site / "vllm-0.20.0.dist-info/RECORD"
    lines = record.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("vllm/b.py,"))
    lines[at] = lines[at].rstrip("\n").rsplit(",", 1)[0] + ",12x\n"
    record.write_text("".join(lines))
    before = snapshot(site)
    one_error_line(run(two_patch_series, command, "--target", str(site)), "RECORD", f"line {at + 1}", "malformed")
    assert snapshot(site) == before


def test_corrupt_member_of_a_wheel_is_one_line_exit_2(tmp_path, base_files, two_patch_series):
    import zipfile

    from test_wheel import make_wheel
    source = make_wheel(tmp_path / "in", base_files)
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as zf:
        offset = zf.getinfo("vllm/dup.py").header_offset  # untouched by the series: copied raw
    data[offset:offset + 4] = b"XXXX"
    source.write_bytes(bytes(data))
    one_error_line(run(two_patch_series, "build-wheel", "--from", str(source), "--out", str(tmp_path / "dist")),
                   source.name, "corrupt wheel")
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_unexpected_exception_is_one_line_unless_debugging(tree, two_patch_series, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("something\nunforeseen")

    monkeypatch.setattr(operations, "status", boom)
    line = one_error_line(run(two_patch_series, "status", "--target", str(tree)), "RuntimeError",
                          "something unforeseen", "VLLM_PATCH_DEBUG=1")
    assert "bug" in line
    monkeypatch.setenv("VLLM_PATCH_DEBUG", "1")
    result = run(two_patch_series, "status", "--target", str(tree))
    assert result.exit_code == 2 and "Traceback" in result.stderr and "RuntimeError" in result.stderr


@pytest.mark.parametrize("where", ["added", "context"])
def test_nul_byte_in_a_patch_is_a_bad_patch(tree, two_patch_series, where):
    if where == "added":
        corrupt(two_patch_series, b"+KERNEL = 1\n", b"+KERNEL = '\x00'\n")
    else:
        corrupt(two_patch_series, b" line 9\n", b" line\x00 9\n")
    before = snapshot(tree)
    for command in ("apply", "status"):
        one_error_line(run(two_patch_series, command, "--target", str(tree)), "NUL byte", "0001-first-fix.patch")
    assert snapshot(tree) == before


# --- Options and output.

def test_python_and_target_together_are_refused(tree, two_patch_series):
    import sys
    before = snapshot(tree)
    result = run(two_patch_series, "apply", "--target", str(tree), "--python", sys.executable)
    assert result.exit_code == 2 and "not both" in result.stderr and "Traceback" not in result.output
    result = run(two_patch_series, "status", "--python", sys.executable, "--kind", "tree")
    assert result.exit_code == 2 and "--kind tree" in result.stderr
    assert snapshot(tree) == before


def test_series_option_after_the_command(tree, two_patch_series):
    result = CliRunner().invoke(main, ["status", "--target", str(tree), "--series", str(two_patch_series), "--json"])
    assert result.exit_code == 0, result.output
    assert [p["name"] for p in json.loads(result.stdout)["patches"]] == ["0001-first-fix.patch",
                                                                       "0002-second-fix.patch"]
    result = CliRunner().invoke(main, ["series", "--series", str(two_patch_series), "--json"])
    assert result.exit_code == 0 and len(json.loads(result.stdout)["patches"]) == 2


def test_dry_run_says_would(tree, two_patch_series):
    result = run(two_patch_series, "apply", "--target", str(tree), "--dry-run")
    assert result.exit_code == 0
    assert "OK: would apply 2 patches" in result.stdout and "(would change 3 files)" in result.stdout
    assert "would be applied" in result.stdout and "-> applied" not in result.stdout
    assert run(two_patch_series, "apply", "--target", str(tree)).exit_code == 0
    result = run(two_patch_series, "revert", "--target", str(tree), "--dry-run")
    assert "OK: would revert 2 patches" in result.stdout and "would be applies" in result.stdout


def test_tables_show_whole_names_and_paths(tmp_path, base_files):
    from helpers import build_series
    deep = "vllm/model_executor/layers/quantization/kernels/a_rather_long_module_name_for_a_kernel.py"
    subject = "A fix whose subject is long enough to make its patch file name longer than a terminal line"
    series_dir = build_series(tmp_path / "s", base_files, [(subject, {deep: b"KERNEL = 2\n"})])
    name = sorted((series_dir / "patches").glob("*.patch"))[0].name
    tree = tmp_path / "t"
    for rel, data in base_files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    for args in (["series"], ["status", "--target", str(tree)], ["apply", "--dry-run", "--target", str(tree)]):
        result = run(series_dir, *args)
        assert result.exit_code == 0, result.output
        assert name in result.stdout, result.stdout
        if args == ["series"]:
            assert deep in result.stdout, result.stdout


@pytest.mark.parametrize("kind", ["tree", "site-packages"])
@pytest.mark.parametrize("command", ["apply", "revert"])
def test_commit_on_a_target_that_is_not_a_checkout_is_refused(tmp_path, tree, base_files, two_patch_series,
                                                              kind, command):
    target = tree if kind == "tree" else make_site_packages(tmp_path / "site", base_files)
    if command == "revert":
        assert run(two_patch_series, "apply", "--target", str(target)).exit_code == 0
    before = snapshot(target)
    result = run(two_patch_series, command, "--target", str(target), "--commit")
    assert result.exit_code == 2, result.output
    assert error_lines(result) == [f"error: --commit: {kind} {target} is not a git checkout; only a checkout "
                                   "records each patch as a commit"]
    assert snapshot(target) == before


@pytest.mark.parametrize("args, words", [
    (["bogus"], ["No such command 'bogus'"]),
    (["status", "--nope"], ["No such option", "--nope"]),
    (["status", "--target", ".", "--kind", "weird"], ["--kind", "weird"]),
    (["series", "--json", "extra"], ["unexpected extra argument"]),
    (["build-wheel", "--out", "FILE"], ["--out", "is a file"]),
    (["apply"], ["give --target PATH"]),
])
def test_usage_errors_are_one_line_exit_2(tmp_path, two_patch_series, args, words):
    """click's own usage errors (unknown command or option, bad value) are one line, like every other error."""
    (tmp_path / "FILE").write_bytes(b"a file")
    args = [str(tmp_path / "FILE") if a == "FILE" else a for a in args]
    result = run(two_patch_series, *args)
    assert result.stderr.splitlines() == [one_error_line(result, *words)], result.stderr
    assert "Usage:" not in result.output and (tmp_path / "FILE").read_bytes() == b"a file"


def test_usage_error_of_the_console_script_is_one_line_and_help_still_works(two_patch_series):
    """The real entry point (`python -m vllm_patch`, as the console script) exits 2 with one line."""
    import subprocess
    import sys
    env = {**os.environ, "VLLM_PATCH_SERIES": str(two_patch_series)}
    done = subprocess.run([sys.executable, "-m", "vllm_patch", "bogus"], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == ["error: No such command 'bogus'. (see 'vllm-patch --help')"], done.stderr
    done = subprocess.run([sys.executable, "-m", "vllm_patch", "--help"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "Usage:" in done.stdout and "build-wheel" in done.stdout
    done = subprocess.run([sys.executable, "-m", "vllm_patch", "status", "-h"], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0 and "--target" in done.stdout
