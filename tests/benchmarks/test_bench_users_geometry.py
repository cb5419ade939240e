"""bench_users_geometry.py's comparison: the same engines at one GPU and split over two."""

from __future__ import annotations

import bench_users_geometry as bench


def test_tensor_parallel_splits_every_engine_and_changes_nothing_else():
    one = bench.configurations("3bit_nc", [8192])
    two = bench.configurations("3bit_nc", [8192], tensor_parallel=2)
    assert [label for label, _, _ in one] == [label for label, _, _ in two]
    for (_, tree1, e1), (_, tree2, e2) in zip(one, two, strict=True):
        assert tree1 == tree2 and "tensor_parallel_size" not in e1.kwargs
        assert e2.kwargs.pop("tensor_parallel_size") == 2
        assert e2.kwargs == e1.kwargs and e2.workloads == e1.workloads
