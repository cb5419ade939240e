"""The multi-query kernel file is one file: every line that adds it adds the current line's bytes.

Lines v0.32, v0.27 and v0.25 carry the current line's kernel (``vllm/v1/attention/ops/triton_turboquant_verify.py``,
added whole by their 0003); a fix made to one copy and not the others would ship two kernels under one name. Line
v0.20's 0007 adds an earlier version of the file and is not compared. Read with unidiff from the patch files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from unidiff import PatchSet

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "vllm/v1/attention/ops/triton_turboquant_verify.py"
CURRENT = ROOT / "patches" / "0003-turboquant-multi-query-verify-kernel.patch"
CARRIED = {line: ROOT / "lines" / line / "patches" / CURRENT.name for line in ("v0.32", "v0.27", "v0.25")}


def added_file(patch: Path, path: str = KERNEL) -> str:
    """The text a patch adds as the new file ``path`` (it must create it whole)."""
    for patched in PatchSet(patch.read_text(encoding="utf-8")):
        if patched.path == path:
            assert patched.is_added_file, f"{patch.name} changes {path} instead of adding it"
            return "".join(line.value for hunk in patched for line in hunk if line.is_added)
    raise AssertionError(f"{patch} does not add {path}")


@pytest.mark.parametrize("line", sorted(CARRIED))
def test_carried_lines_add_the_current_kernel_file(line):
    assert added_file(CARRIED[line]) == added_file(CURRENT), (
        f"line {line}'s 0003 adds another {KERNEL} than the current line's: change every copy together")


def test_a_hand_edited_copy_is_told_apart(tmp_path):
    edited = tmp_path / CURRENT.name
    edited.write_text(CURRENT.read_text(encoding="utf-8").replace("+_MAX_REGISTERS = 255\n", "+_MAX_REGISTERS = 254\n",
                                                                   1), encoding="utf-8")
    assert edited.read_text(encoding="utf-8") != CURRENT.read_text(encoding="utf-8")
    assert added_file(edited) != added_file(CURRENT)
