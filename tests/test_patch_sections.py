"""A git file section must carry its ``---``/``+++`` lines, agreeing with its ``diff --git`` line, before its
first hunk (git apply refuses a section without them; GNU patch takes the paths from them, so a contradiction
patches another file than the one reviewed); a CRLF patch is refused as such
(tool/vllm_patch/engine/patchfile.py)."""

from __future__ import annotations

import pytest

from test_patchfile import GOOD
from vllm_patch.engine.patchfile import parse_patch
from vllm_patch.errors import InputError

SECTION = b"--- a/vllm/a.py\n+++ b/vllm/a.py\n"


@pytest.mark.parametrize(("new", "words"), [
    (b"--- a/vllm/a.py\n", ["vllm/a.py", "'+++ b/vllm/a.py'", "before its first hunk"]),
    (b"+++ b/vllm/a.py\n", ["vllm/a.py", "'--- a/vllm/a.py'", "before its first hunk"]),
    (b"", ["vllm/a.py", "'--- a/vllm/a.py'", "before its first hunk"]),
    (b"--- a/vllm/other.py\n+++ b/vllm/a.py\n", ["'--- a/vllm/other.py'", "diff --git a/vllm/a.py b/vllm/a.py"]),
    (b"--- a/vllm/a.py\n+++ b/vllm/other.py\n", ["'+++ b/vllm/other.py'", "diff --git a/vllm/a.py b/vllm/a.py"]),
    (b"--- a/vllm/other.py\n+++ b/vllm/other.py\n", ["'--- a/vllm/other.py'", "diff --git a/vllm/a.py b/vllm/a.py"]),
    (b"--- vllm/a.py\n+++ b/vllm/a.py\n", ["'--- vllm/a.py'"]),
])
def test_a_section_whose_file_lines_lack_or_contradict_is_refused(new, words):
    assert SECTION in GOOD
    with pytest.raises(InputError) as caught:
        parse_patch("bad.patch", GOOD.replace(SECTION, new))
    message = caught.value.message
    assert message.startswith("bad.patch: ") and "\n" not in message, message
    assert all(w in message for w in words), message


def test_the_new_file_section_lines_are_checked_too():
    with pytest.raises(InputError, match=r"'\+\+\+ b/vllm/elsewhere.py'"):
        parse_patch("bad.patch", GOOD.replace(b"+++ b/vllm/new.py", b"+++ b/vllm/elsewhere.py"))


def test_a_crlf_patch_is_refused_as_such():
    with pytest.raises(InputError) as caught:
        parse_patch("crlf.patch", GOOD.replace(b"\n", b"\r\n"))
    message = caught.value.message
    assert "CRLF" in message and "rename" not in message and "\r" not in message, message


def test_sections_git_writes_still_parse():
    """Modified, new and deleted files, an empty new file (no ---/+++ lines, no hunk), a path with a space."""
    deleted = (b"diff --git a/vllm/old.py b/vllm/old.py\ndeleted file mode 100644\nindex 2c18545..0000000\n"
               b"--- a/vllm/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x = 1\n-y = 2\n")
    empty = b"diff --git a/vllm/empty.py b/vllm/empty.py\nnew file mode 100644\nindex 0000000..e69de29\n"
    spaced = (b"diff --git a/vllm/a b.py b/vllm/a b.py\nindex 1111111..2222222 100644\n--- a/vllm/a b.py\n"
              b"+++ b/vllm/a b.py\n@@ -1 +1 @@\n-u\n+v\n")
    text = GOOD.replace(b"-- \n2.39.5\n", deleted + empty + spaced + b"-- \n2.39.5\n")
    patch = parse_patch("ok.patch", text)
    assert [(f.path, f.kind) for f in patch.files] == [
        ("vllm/a.py", "modify"), ("vllm/new.py", "add"), ("vllm/old.py", "delete"), ("vllm/empty.py", "add"),
        ("vllm/a b.py", "modify")]
