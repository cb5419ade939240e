"""The multi-query kernel file is one file: every line that adds it adds the current line's bytes.

Lines v0.32, v0.27 and v0.25 carry the current line's kernel (``vllm/v1/attention/ops/triton_turboquant_verify.py``,
added whole by their 0003: line v0.32's is the current line's patch itself, listed ``from current``; lines v0.27 and
v0.25 hold their own 0003, whose other hunks are their releases'); a fix made to one copy and not the others would
ship two kernels under one name. Line v0.20's 0007 adds an earlier version of the file and is not compared. Read
with unidiff from the patches as each line's series loads them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from unidiff import PatchSet

from vllm_patch.lines import line_named

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "vllm/v1/attention/ops/triton_turboquant_verify.py"
CURRENT = ROOT / "patches" / "0003-turboquant-multi-query-verify-kernel.patch"
CARRIED = ("v0.32", "v0.27", "v0.25")


def added_file(patch: Path | str, path: str = KERNEL) -> str:
    """The text a patch (a file, or its text) adds as the new file ``path`` (it must create it whole)."""
    text = patch.read_text(encoding="utf-8") if isinstance(patch, Path) else patch
    for patched in PatchSet(text):
        if patched.path == path:
            assert patched.is_added_file, f"the patch changes {path} instead of adding it"
            return "".join(line.value for hunk in patched for line in hunk if line.is_added)
    raise AssertionError(f"the patch does not add {path}")


@pytest.mark.parametrize("line", CARRIED)
def test_carried_lines_add_the_current_kernel_file(line):
    series = line_named(ROOT, line).load()
    patch = series.patches[series.names.index(CURRENT.name)]
    assert added_file(patch.raw.decode("utf-8")) == added_file(CURRENT), (
        f"line {line}'s 0003 adds another {KERNEL} than the current line's: change every copy together")


def test_a_hand_edited_copy_is_told_apart(tmp_path):
    edited = tmp_path / CURRENT.name
    edited.write_text(CURRENT.read_text(encoding="utf-8").replace("+_MAX_REGISTERS = 255\n", "+_MAX_REGISTERS = 254\n",
                                                                   1), encoding="utf-8")
    assert edited.read_text(encoding="utf-8") != CURRENT.read_text(encoding="utf-8")
    assert added_file(edited) != added_file(CURRENT)
