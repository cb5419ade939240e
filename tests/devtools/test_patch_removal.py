"""devtools/patch_removal.py's pure parts: how tests name a patch, and the tree without a patch (a later patch that
needs it is left out too, one that does not is kept). Running pytest per patch is the script's own job."""

from __future__ import annotations

from pathlib import Path

import pytest
from patch_removal import Verdict, slug, without

from helpers import build_series, edit
from vllm_patch.series import load_series

BASE = {"vllm/a.py": b"".join(f"line {i}\n".encode() for i in range(1, 31)),
        "vllm/b.py": b"x = 1\n"}


@pytest.mark.parametrize(("name", "expected"), [
    ("0003-turboquant-multi-query-verify-kernel.patch", "turboquant-multi-query-verify-kernel"),
    ("0012-gdn-x.patch", "gdn-x"),
])
def test_a_patch_is_named_without_its_number(name, expected):
    assert slug(name) == expected


def test_without_a_patch_leaves_out_the_later_ones_that_need_it(tmp_path: Path):
    a1 = edit(BASE["vllm/a.py"], b"line 10\n", b"line 10 first\n")
    a2 = edit(a1, b"line 10 first\n", b"line 10 second\n")  # needs the first
    b1 = edit(BASE["vllm/b.py"], b"x = 1\n", b"x = 2\n")  # needs nothing
    series = load_series(build_series(tmp_path / "s", BASE, [
        ("first", {"vllm/a.py": a1}), ("second", {"vllm/a.py": a2}), ("third", {"vllm/b.py": b1})]))
    base = tmp_path / "base"
    for rel, data in BASE.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(data)
    first, second, third = series.names
    kept, left_out = without(series, first, base)
    assert [p.name for p in kept] == [third] and left_out == [second]
    kept, left_out = without(series, third, base)
    assert [p.name for p in kept] == [first, second] and left_out == []


def test_a_patch_whose_tests_all_pass_without_it_fails_the_check():
    assert not Verdict("current", "0001-x.patch", tests=3, failed=0).ok
    assert not Verdict("current", "0001-x.patch", tests=0).ok
    assert Verdict("current", "0001-x.patch", tests=3, failed=1).ok
