"""Command logic that no single target or engine module owns."""

from __future__ import annotations

import pytest

from vllm_patch import operations
from vllm_patch.errors import LockBusy
from vllm_patch.infrastructure.locking import target_lock
from vllm_patch.series import load_series
from vllm_patch.targets import TreeTarget


class Watched(TreeTarget):
    """A tree that notes, at each read, whether another run could take its lock right then."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.unlocked_reads = 0

    def read(self, paths):
        try:
            with target_lock(self.lock_dir):
                self.unlocked_reads += 1
        except LockBusy:
            pass
        return super().read(paths)


@pytest.mark.parametrize("applied", [False, True])
def test_status_reads_the_target_under_its_lock(tree, two_patch_series, applied):
    series = load_series(two_patch_series)
    if applied:
        operations.apply(TreeTarget(tree), series)
    target = Watched(tree)
    outcome = operations.status(target, series)
    assert outcome.ok and outcome.verdict == ("applied" if applied else "applies")
    assert target.unlocked_reads == 0


def test_apply_reads_the_target_under_its_lock(tree, two_patch_series):
    target = Watched(tree)
    operations.apply(target, load_series(two_patch_series))
    assert target.unlocked_reads == 0
