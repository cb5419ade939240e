from __future__ import annotations

import pytest

from vllm_patch.engine.patchfile import parse_patch
from vllm_patch.errors import InputError

GOOD = b"""\
From 0123456789abcdef0123456789abcdef01234567 Mon Sep 17 00:00:00 2001
From: Ada Dev <ada@example.org>
Date: Sun, 1 Nov 2026 12:00:00 +0000
Subject: [PATCH 1/2] TurboQuant: fix the thing

Longer description
over two lines.

Origin: https://github.com/vllm-project/vllm/pull/1
Bug: https://github.com/vllm-project/vllm/issues/2
Forwarded: yes
---
 vllm/a.py | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/vllm/a.py b/vllm/a.py
index 1111111..2222222 100644
--- a/vllm/a.py
+++ b/vllm/a.py
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
diff --git a/vllm/new.py b/vllm/new.py
new file mode 100755
index 0000000..2c18545
--- /dev/null
+++ b/vllm/new.py
@@ -0,0 +1,2 @@
+x = 1
+y = 2
-- 
2.39.5
"""


def test_parses_mail_header_trailers_and_files():
    p = parse_patch("0001-fix.patch", GOOD)
    assert p.subject == "TurboQuant: fix the thing"
    assert p.author == "Ada Dev <ada@example.org>"
    assert p.trailer("origin") == "https://github.com/vllm-project/vllm/pull/1"
    assert p.trailer("Forwarded") == "yes"
    assert [(f.path, f.kind) for f in p.files] == [("vllm/a.py", "modify"), ("vllm/new.py", "add")]
    hunk = p.files[0].hunks[0]
    assert hunk.pre == ("one\n", "two\n", "three\n")
    assert hunk.post == ("one\n", "TWO\n", "three\n")
    assert p.files[1].hunks[0].post == ("x = 1\n", "y = 2\n")
    assert p.files[1].mode == 0o755


def test_signature_is_not_part_of_the_last_hunk():
    p = parse_patch("p", GOOD)
    assert all("2.39.5" not in line for line in p.files[1].hunks[0].post)


def test_crlf_lines_are_kept():
    diff = GOOD.replace(b" one\n-two\n+TWO\n three\n", b" one\r\n-two\r\n+TWO\r\n three\r\n")
    hunk = parse_patch("p", diff).files[0].hunks[0]
    assert hunk.pre == ("one\r\n", "two\r\n", "three\r\n")


def test_no_newline_marker_strips_only_the_marked_side():
    diff = GOOD.replace(b" one\n-two\n+TWO\n three\n",
                        b" one\n-two\n+TWO\n three\n\\ No newline at end of file\n")
    hunk = parse_patch("p", diff).files[0].hunks[0]
    assert hunk.pre[-1] == "three" and hunk.post[-1] == "three"
    diff = GOOD.replace(b" one\n-two\n+TWO\n three\n",
                        b" one\n two\n-three\n\\ No newline at end of file\n+three\n")
    hunk = parse_patch("p", diff).files[0].hunks[0]
    assert hunk.pre == ("one\n", "two\n", "three") and hunk.post == ("one\n", "two\n", "three\n")


def test_inverted_swaps_images_and_kinds():
    p = parse_patch("p", GOOD).inverted()
    assert [(f.path, f.kind) for f in p.files] == [("vllm/new.py", "delete"), ("vllm/a.py", "modify")]
    assert p.files[1].hunks[0].pre == ("one\n", "TWO\n", "three\n")


@pytest.mark.parametrize(("change", "message"), [
    ((b"@@ -1,3 +1,3 @@", b"@@ -1,x +1,3 @@"), "malformed hunk header"),
    ((b"@@ -1,3 +1,3 @@", b"@@ -1,4 +1,4 @@"), "malformed diff"),
    ((b"@@ -1,3 +1,3 @@", b"@@ -1,2 +1,3 @@"), "malformed diff"),
    ((b"a/vllm/a.py b/vllm/a.py\nindex 1111111..2222222 100644\n--- a/vllm/a.py\n+++ b/vllm/a.py",
      b"a/../a.py b/../a.py\nindex 1111111..2222222 100644\n--- a/../a.py\n+++ b/../a.py"), "unsafe path"),
    ((b"diff --git a/vllm/a.py b/vllm/a.py\nindex 1111111..2222222 100644\n--- a/vllm/a.py\n+++ b/vllm/a.py",
      b"diff --git a//etc/passwd b//etc/passwd\nindex 1111111..2222222 100644\n--- a//etc/passwd\n"
      b"+++ b//etc/passwd"), "unsafe path"),
    ((b"new file mode 100755\nindex 0000000..2c18545\n--- /dev/null\n+++ b/vllm/new.py\n"
      b"@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n",
      b"new file mode 100644\nindex 0000000..2c18545\nGIT binary patch\nliteral 3\nKcmZ>Y%K!iX\n\n"),
     "binary"),
    ((b"new file mode 100755\nindex 0000000..2c18545\n--- /dev/null\n+++ b/vllm/new.py\n"
      b"@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n",
      b"index 0000000..2c18545\nBinary files /dev/null and b/vllm/new.py differ\n"), "binary"),
])
def test_bad_diffs_are_refused_with_a_clear_message(change, message):
    old, new = change
    assert old in GOOD
    with pytest.raises(InputError, match=message):
        parse_patch("bad.patch", GOOD.replace(old, new))


def test_truncated_patch():
    cut = GOOD[: GOOD.index(b"+y = 2")]
    with pytest.raises(InputError, match="truncated|malformed"):
        parse_patch("cut.patch", cut)


def test_empty_patches():
    with pytest.raises(InputError, match="empty patch"):
        parse_patch("e.patch", b"")
    with pytest.raises(InputError, match="empty patch"):
        parse_patch("e.patch", GOOD[: GOOD.index(b"diff --git")])


def test_plain_unified_diff_without_git_header_is_refused():
    with pytest.raises(InputError, match="git format"):
        parse_patch("p", b"Subject: x\n\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n")


def test_hunk_without_anchor_is_refused():
    diff = GOOD.replace(b"@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n", b"@@ -1,0 +2,1 @@\n+TWO\n")
    with pytest.raises(InputError, match="no anchor"):
        parse_patch("p", diff)


def test_rename_is_refused():
    diff = GOOD.replace(b"new file mode 100755\n", b"similarity index 90%\nrename from vllm/x.py\n")
    with pytest.raises(InputError, match="renames"):
        parse_patch("p", diff)


def test_same_file_twice_is_refused():
    part = GOOD[GOOD.index(b"diff --git a/vllm/a.py"): GOOD.index(b"diff --git a/vllm/new.py")]
    diff = GOOD.replace(b"diff --git a/vllm/new.py", part + b"diff --git a/vllm/new.py")
    with pytest.raises(InputError, match="twice"):
        parse_patch("p", diff)


def test_non_utf8_patch():
    with pytest.raises(InputError, match="UTF-8"):
        parse_patch("p", GOOD.replace(b"TWO", b"T\xffO"))


def test_undecodable_subject_is_kept_raw_not_a_crash():
    for subject in (b"=?x-unknown?q?fix?=", b"=?utf-8?q?caf=E9?="):
        p = parse_patch("p", GOOD.replace(b"[PATCH 1/2] TurboQuant: fix the thing", subject))
        assert p.subject == subject.decode()
