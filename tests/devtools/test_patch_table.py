"""The patch table in docs/patch-format.md is the one devtools/patch_table.py generates from the headers, and
the script's rules for kind and upstream references."""

from __future__ import annotations

import pytest
from patch_table import BEGIN, DOC, END, kind, main, references, table, with_table

from vllm_patch.engine.patchfile import Patch


def header(**trailers: str) -> Patch:
    pairs = tuple((key.replace("_", "-"), value) for key, value in trailers.items())
    return Patch("0001-x.patch", "x", "a", "d", "", pairs, (), "", b"")


def test_the_table_in_the_doc_is_current(capsys):
    assert main(["--check"]) == 0, capsys.readouterr().err


def test_a_stale_table_is_caught(tmp_path, monkeypatch):
    stale = with_table(DOC.read_text(), table().replace("| fix |", "| feature |", 1))
    doc = tmp_path / "patch-format.md"
    doc.write_text(stale)
    monkeypatch.setattr("patch_table.DOC", doc)
    monkeypatch.setattr("patch_table.PROJECT", tmp_path)
    assert main(["--check"]) == 1 and doc.read_text() == stale
    assert main([]) == 0 and main(["--check"]) == 0
    assert doc.read_text().count(BEGIN) == 1 and doc.read_text().count(END) == 1


@pytest.mark.parametrize(
    ("trailers", "expected"),
    [
        ({"Origin": "backport, vLLM 0.32.0's routing"}, "backport"),
        ({"Origin": "upstream, https://github.com/vllm-project/vllm/commit/abc"}, "backport"),
        ({"Origin": "vendor", "Bug": "https://github.com/vllm-project/vllm/issues/1"}, "fix"),
        ({"Origin": "https://github.com/vllm-project/vllm/pull/40738", "Bug": "x"}, "fix"),
        ({"Origin": "vendor"}, "feature"),
        ({"Origin": "vendor", "Bug": "x", "Kind": "Feature"}, "feature"),
    ],
)
def test_kind_comes_from_origin_and_bug(trailers, expected):
    assert kind(header(**trailers)) == expected


def test_references_name_each_issue_once_bug_first():
    patch = header(
        Bug="https://github.com/vllm-project/vllm/issues/53051",
        Origin="vendor (related: https://github.com/vllm-project/vllm/pull/58164)",
        Drop_When="V1 is removed (vllm#53051; vllm PR #54102, #53059 or an equivalent merged)",
    )
    assert [r.split("]")[0] for r in references(patch)] == ["[vllm#53051", "[vllm#58164", "[vllm#54102", "[vllm#53059"]
    assert "/pull/54102)" in references(patch)[2] and "/pull/58164)" in references(patch)[1]
    assert references(header(Origin="vendor")) == []
