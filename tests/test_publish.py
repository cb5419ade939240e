"""A build-wheel run killed midway leaves no file named like a wheel, and the next run sweeps
what it left (tool/vllm_patch/artifacts/publish.py, through the wheel builder)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import vllm_patch.artifacts.wheel as wheel
from test_wheel import make_wheel
from vllm_patch.artifacts.wheel import build_wheel
from vllm_patch.errors import TargetError
from vllm_patch.series import load_series

# The killed run: the real builder, paused (by the child itself) after its first member is written.
KILLED_RUN = """
import sys, time
from pathlib import Path
import vllm_patch.artifacts.wheel as wheel
from vllm_patch.series import load_series

real = wheel.copy_raw
def copy_then_pause(*args):
    real(*args)
    print("writing", flush=True)
    time.sleep(120)
wheel.copy_raw = copy_then_pause
wheel.build_wheel(load_series(Path(sys.argv[1])), Path(sys.argv[2]), Path(sys.argv[3]))
"""


def entries(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_a_killed_build_leaves_no_wheel_and_the_next_run_sweeps_it(tmp_path, base_files, two_patch_series):
    source = make_wheel(tmp_path / "in", {**base_files, **{f"vllm/m{i}.py": b"X = 1\n" for i in range(5)}})
    out = tmp_path / "dist"
    child = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(two_patch_series), str(source), str(out)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    left = entries(out)
    assert left, "the killed run left nothing to sweep"
    assert not [e for e in left if e.endswith(".whl")], left  # nothing a tool could take for a wheel
    assert all(Path(e).name.startswith(".") for e in left), left
    built = build_wheel(load_series(two_patch_series), source, out)
    assert entries(out) == [built.path.name]
    assert any("interrupted" in note for note in built.notes), built.notes
    with zipfile.ZipFile(built.path) as zf:
        assert zf.testzip() is None


def test_leftovers_of_an_older_killed_run_are_swept(tmp_path, base_files, two_patch_series):
    """What a run killed under the previous layout left (a cut-off wheel in a hidden .build-* folder),
    and a partial whose owner is gone, go at the next run; other files stay."""
    source = make_wheel(tmp_path / "in", base_files)
    out = tmp_path / "dist"
    name = "vllm-0.20.0+vp.0123456789ab-cp38-abi3-linux_x86_64.whl"
    (out / ".build-k3j2x9").mkdir(parents=True)
    (out / ".build-k3j2x9" / name).write_bytes(b"PK\x03\x04cut off")
    (out / f".{name}.partial-999999999").write_bytes(b"PK\x03\x04cut off")
    (out / "keep.txt").write_bytes(b"mine")
    (out / ".hidden").write_bytes(b"mine too")
    built = build_wheel(load_series(two_patch_series), source, out)
    assert entries(out) == sorted([".hidden", built.path.name, "keep.txt"])


def test_a_full_disk_names_the_wheel_and_leaves_nothing(tmp_path, base_files, two_patch_series, monkeypatch):
    """ENOSPC while the wheel is written (zipfile's write carries no file name): one error naming the wheel
    that was being written and saying nothing was changed, and no partial left in dist/."""
    source = make_wheel(tmp_path / "in", base_files)
    out = tmp_path / "dist"

    def full_disk(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(wheel, "copy_raw", full_disk)
    with pytest.raises(TargetError) as info:
        build_wheel(load_series(two_patch_series), source, out)
    message = info.value.message
    assert message.startswith(f"cannot write {out}/vllm-0.20.0+vp.") and message.endswith(
        ".whl: No space left on device; nothing was changed"), message
    assert entries(out) == []
