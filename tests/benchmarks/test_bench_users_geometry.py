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


def test_line_without_speculation_is_the_line_s_engine_without_its_drafter():
    rows = {label: (tree, engine) for label, tree, engine in bench.configurations("3bit_nc", [8192])}
    line_tree, line = rows["line FULL_AND_PIECEWISE"]
    tree, plain = rows[bench.LINE_NO_SPEC]
    assert tree == line_tree == "patched"
    assert "speculative_config" in line.kwargs and "speculative_config" not in plain.kwargs
    assert {k: v for k, v in line.kwargs.items() if k != "speculative_config"} == plain.kwargs


def test_batches_past_eight_get_prompts_and_sequences_for_them():
    (_, _, engine), *_ = bench.configurations("k8v4", [1024], max_num_seqs=32)
    assert engine.kwargs["max_num_seqs"] == 32
    assert len(engine.workloads[0].prompts) == 32
    (_, _, small), *_ = bench.configurations("k8v4", [1024])
    assert small.kwargs["max_num_seqs"] == 8 and len(small.workloads[0].prompts) == 8


def test_breakdown_table_names_the_host_scopes_of_each_cell(capsys):
    summary = {"steps": 12, "gpu_ms": 7.3, "launches": 528, "stages": {"target attention": 0.75},
               "host": {"scopes": {"gpu_model_runner: draft": 5.42, "gpu_model_runner: preprocess": 4.72}}}
    bench.print_breakdown({("line FULL_AND_PIECEWISE", 8192, 8): summary},
                          {("line FULL_AND_PIECEWISE", 8192, 8): [10.0, 10.1, 9.9]},
                          [(8192, 8)], ["line FULL_AND_PIECEWISE", "line no speculation"])
    out = capsys.readouterr().out
    assert "10.00    7.30   2.70" in out  # step, GPU, host = step - GPU
    assert "line FULL_AND_PIECEWISE       8192     8  draft 5.42, preprocess 4.72" in out
    assert "line no speculation" not in out
