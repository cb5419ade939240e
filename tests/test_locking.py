from __future__ import annotations

import subprocess
import sys
import time

import pytest

from vllm_patch.errors import LockBusy
from vllm_patch.infrastructure.locking import target_lock

HOLD = "import sys, time\nfrom pathlib import Path\nfrom vllm_patch.infrastructure.locking import target_lock\n" \
       "with target_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(float(sys.argv[2]))\n"


def test_second_run_fails_clearly_or_waits(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), "1.5"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LockBusy, match="another vllm-patch run"), target_lock(tmp_path, wait=0.1):
        pass
    start = time.monotonic()
    waited = []
    with target_lock(tmp_path, wait=20, on_wait=lambda: waited.append(1)):
        pass
    assert waited and time.monotonic() - start > 0.2
    holder.wait()


def test_lock_is_released_when_holder_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), "60"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    with target_lock(tmp_path, wait=5):
        pass
