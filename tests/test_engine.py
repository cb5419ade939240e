from __future__ import annotations

from pathlib import Path

import pytest

from helpers import build_series, edit
from vllm_patch.engine.analysis import HunkState, State, analyze, classify, decode
from vllm_patch.errors import InputError
from vllm_patch.series import load_series


def states(analysis):
    return [r.state for r in analysis.reports]


def series_of(tmp_path: Path, base: dict, steps, name="s"):
    return load_series(build_series(tmp_path / name, base, steps)).patches


def test_fresh_tree_applies_then_applied(two_patch_series, base_files):
    patches = load_series(two_patch_series).patches
    a = analyze(patches, base_files)
    assert a.consistent and a.applied == 0 and states(a) == [State.APPLIES] * 2
    assert a.patched["vllm/new_kernel.py"] == b"KERNEL = 1\n"
    assert b"line 30b added" in a.patched["vllm/a.py"]
    done = analyze(patches, {**base_files, **a.patched})
    assert done.consistent and done.applied == 2 and states(done) == [State.APPLIED] * 2
    assert done.base == {p: base_files.get(p) for p in done.base}


def test_prefix_applied_is_recognised(two_patch_series, base_files):
    patches = load_series(two_patch_series).patches
    a = analyze(patches, base_files)
    after_first = {**base_files, **a.stage(0)}
    half = analyze(patches, after_first)
    assert half.consistent and half.applied == 1
    assert states(half) == [State.APPLIED, State.APPLIES]
    assert half.verdict == "partly applied"


def test_later_patch_rewriting_earlier_context_still_reads_as_applied(tmp_path, base_files):
    a1 = edit(base_files["vllm/a.py"], b"line 10\n", b"line 10 A\n")
    a2 = edit(a1, b"line 11\n", b"line 11 B\n")  # inside patch 1's context
    patches = series_of(tmp_path, base_files, [("one", {"vllm/a.py": a1}), ("two", {"vllm/a.py": a2})])
    full = {**base_files, "vllm/a.py": a2}
    a = analyze(patches, full)
    assert a.consistent and a.applied == 2
    assert a.base["vllm/a.py"] == base_files["vllm/a.py"]


def test_partial_patch(tmp_path, base_files):
    a1 = edit(base_files["vllm/a.py"], b"line 5\n", b"line 5 A\n")
    a1 = edit(a1, b"line 35\n", b"line 35 A\n")
    patches = series_of(tmp_path, base_files, [("one", {"vllm/a.py": a1})])
    half = edit(base_files["vllm/a.py"], b"line 5\n", b"line 5 A\n")
    a = analyze(patches, {**base_files, "vllm/a.py": half})
    assert not a.consistent and states(a) == [State.PARTIAL]
    assert [h.state for h in a.reports[0].hunks] == [HunkState.DONE, HunkState.PENDING]


def test_conflict_when_anchor_is_gone(tmp_path, base_files):
    b1 = edit(base_files["vllm/b.py"], b"return 1\n", b"return 11\n")
    patches = series_of(tmp_path, base_files, [("one", {"vllm/b.py": b1})])
    drifted = {**base_files, "vllm/b.py": base_files["vllm/b.py"].replace(b"def f", b"def h")}
    a = analyze(patches, drifted)
    assert not a.consistent and states(a) == [State.CONFLICT]
    assert "conflict" in a.reports[0].problems()[0]


def test_ambiguous_names_every_matching_line(tmp_path, base_files):
    dup = base_files["vllm/dup.py"]
    patched = dup.replace(b"q = 0\n", b"q = 0\nw = 9\n")
    patches = series_of(tmp_path, base_files, [("one", {"vllm/dup.py": patched})])
    # The same block twice more makes the anchor (3 lines each side) ambiguous.
    twice = dup + b"q = 0\nx = 1\ny = 2\nz = 3\n"
    a = analyze(patches, {**base_files, "vllm/dup.py": twice})
    assert states(a) == [State.AMBIGUOUS]
    hunk = a.reports[0].hunks[0]
    assert hunk.anchor_at == (2, 6)
    assert "lines 2, 6" in a.reports[0].problems()[0]


def test_new_and_deleted_files(tmp_path, base_files):
    patches = series_of(tmp_path, base_files, [("one", {"vllm/b.py": None, "vllm/k/new.py": b"n\n"})])
    a = analyze(patches, base_files)
    assert a.patched["vllm/b.py"] is None and a.patched["vllm/k/new.py"] == b"n\n"
    assert analyze(patches, {**base_files, **a.patched}).applied == 1
    clash = analyze(patches, {**base_files, "vllm/k/new.py": b"other\n"})
    assert states(clash) == [State.CONFLICT]


def test_no_trailing_newline_and_crlf(tmp_path):
    base = {"vllm/_version.py": b"", "n.txt": b"a\nb\nc", "w.txt": b"a\r\nb\r\nc\r\n"}
    steps = [("one", {"n.txt": b"a\nB\nc", "w.txt": b"a\r\nB\r\nc\r\n"}),
             ("two", {"n.txt": b"a\nB\nc\n"})]
    patches = series_of(tmp_path, base, steps)
    a = analyze(patches, base)
    assert a.patched["n.txt"] == b"a\nB\nc\n" and a.patched["w.txt"] == b"a\r\nB\r\nc\r\n"
    back = analyze(patches, {**base, **a.patched})
    assert back.applied == 2 and back.base["n.txt"] == b"a\nb\nc"
    lf_only = analyze(patches, {**base, "w.txt": b"a\nb\nc\n"})
    assert states(lf_only)[0] is State.CONFLICT


def test_non_utf8_target_file_is_refused(two_patch_series, base_files):
    patches = load_series(two_patch_series).patches
    with pytest.raises(InputError, match="not UTF-8"):
        analyze(patches, {**base_files, "vllm/a.py": b"\xff\xfe bad"})


def test_classify_applies_hunks_in_order(two_patch_series, base_files):
    patch = load_series(two_patch_series).patches[0]
    files = {p: decode(p, base_files.get(p)) for p in patch.paths}
    report, after = classify(patch, files)
    assert report.state is State.APPLIES
    assert "line 10 patched\n" in after["vllm/a.py"]


def test_decode_keeps_terminators():
    assert decode("x", b"a\r\nb\nc") == ["a\r\n", "b\n", "c"]
    assert decode("x", b"") == []
    assert decode("x", None) is None


def test_append_at_end_of_file_round_trips(tmp_path):
    base = {"f.py": b"a\nb\nc\nd\n"}
    patches = series_of(tmp_path, base, [("append", {"f.py": b"a\nb\nc\nd\ne\nf\n"})])
    a = analyze(patches, base)
    assert a.consistent and states(a) == [State.APPLIES]
    done = analyze(patches, {**base, **a.patched})
    assert done.consistent and done.applied == 1 and done.base["f.py"] == base["f.py"]


def test_insert_at_start_and_delete_trailing_lines_round_trip(tmp_path):
    base = {"f.py": b"a\nb\nc\nd\ne\nf\ng\nh\n"}
    steps = [("edit both ends", {"f.py": b"new\na\nb\nc\nd\ne\nf\n"})]
    patches = series_of(tmp_path, base, steps)
    a = analyze(patches, base)
    assert a.consistent and states(a) == [State.APPLIES]
    assert a.patched["f.py"] == b"new\na\nb\nc\nd\ne\nf\n"
    done = analyze(patches, {**base, **a.patched})
    assert done.applied == 1 and done.base["f.py"] == base["f.py"]


def test_filling_and_emptying_files_keep_them(tmp_path):
    base = {"empty/__init__.py": b"", "full.py": b"x = 1\n"}
    patches = series_of(tmp_path, base, [("fill and empty", {"empty/__init__.py": b"y = 2\n", "full.py": b""})])
    assert [(f.path, f.kind) for f in patches[0].files] == [("empty/__init__.py", "modify"), ("full.py", "modify")]
    a = analyze(patches, base)
    assert a.consistent and a.patched == {"empty/__init__.py": b"y = 2\n", "full.py": b""}
    done = analyze(patches, {**base, **a.patched})
    assert done.applied == 1 and done.base == base
