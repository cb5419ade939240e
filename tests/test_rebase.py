"""The rebase steps on small synthetic files (the real 0.20 -> 0.21 rebase: tests/integration)."""

from __future__ import annotations

from helpers import build_series, edit
from vllm_patch.lifecycle.merge3 import has_markers, merge_file
from vllm_patch.lifecycle.rebase import Step, range_diff, rebase_one, series_text
from vllm_patch.series import load_series

OLD = {"m.txt": b"".join(f"line {i}\n".encode() for i in range(1, 21))}


def one_patch(tmp_path, new_text: bytes):
    return load_series(build_series(tmp_path / "s", OLD, [("p", {"m.txt": new_text})])).patches[0]


def test_each_step(tmp_path):
    patched = edit(OLD["m.txt"], b"line 10\n", b"line 10 ours\n")
    patch = one_patch(tmp_path, patched)
    after = {"m.txt": patched}
    assert rebase_one(patch, OLD, after, OLD, "v2")[0] is Step.CLEAN
    assert rebase_one(patch, OLD, after, after, "v2")[0] is Step.UPSTREAMED
    near = {"m.txt": edit(OLD["m.txt"], b"line 8\n", b"line 8 upstream\n")}
    step, result, _ = rebase_one(patch, OLD, after, near, "v2")
    assert step is Step.MERGED and b"line 8 upstream\n" in result["m.txt"] and b"line 10 ours\n" in result["m.txt"]
    clash = {"m.txt": edit(OLD["m.txt"], b"line 10\n", b"line 10 theirs\n")}
    step, result, conflicts = rebase_one(patch, OLD, after, clash, "v2")
    assert step is Step.CONFLICT and conflicts == ["m.txt"] and has_markers(result["m.txt"])


def test_merge_file_and_markers():
    merged, n = merge_file(b"a\nB\nc\nd\ne\n", b"a\nb\nc\nd\ne\n", b"a\nb\nc\nD\ne\n", ("x", "y", "z"))
    assert (merged, n) == (b"a\nB\nc\nD\ne\n", 0)
    assert not has_markers(merged) and has_markers(b"x\n=======\ny\n")


def test_range_diff_ignores_line_numbers_and_blob_ids():
    old = "From x\n\ndiff --git a/f b/f\nindex 111..222 100644\n@@ -10,7 +10,7 @@ ctx\n-a\n+b\n-- \n2.39\n"
    new = "From y\n\ndiff --git a/f b/f\nindex 333..444 100644\n@@ -12,7 +12,7 @@ ctx\n-a\n+b\n"
    assert range_diff(old, new) == ""
    assert "+-z" in range_diff(old, new.replace("-a", "-z"))


def test_series_text_keeps_comments_and_replaces_the_pin(two_patch_series):
    series = load_series(two_patch_series)
    text = series_text("# my comment\n#: version = 0.20.0\nold.patch\n", series.pin, ["a.patch"])
    assert text.startswith("# my comment\n#: version = 0.20.0\n") and text.endswith("a.patch\n")
    assert "old.patch" not in text
