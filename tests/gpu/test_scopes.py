"""harness.scopes: Model Runner V2's steps in named profiler ranges, open only while asked for, read by
harness.breakdown as the stages Model Runner V1's own scopes give."""

from __future__ import annotations

import json

import pytest

from harness import breakdown, scopes


def _runner_classes():
    class Runner:
        def execute_model(self, x):
            import torch

            return torch.ones(2).add_(x)

        def sample(self, x):
            import torch

            return torch.zeros(2).mul_(x)

    class Speculator:
        def propose(self, x):
            import torch

            return torch.ones(3).sub_(x)

    return Runner, Speculator


def _ranges(tmp_path, run) -> list[tuple[str, str]]:
    """(range, op) for each aten op ``run`` launches, from a real CPU profile."""
    torch = pytest.importorskip("torch")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    ops = [e for e in events if e["name"] in ("aten::add_", "aten::mul_", "aten::sub_")]
    found = breakdown._enclosing(annotations, ops, lambda n: n.startswith(breakdown.OTHER_SCOPE_PREFIX))
    return sorted((found.get(i, {}).get("name"), ops[i]["name"]) for i in range(len(ops)))


def test_each_step_runs_in_its_range_while_opened_and_in_none_otherwise(tmp_path):
    runner, speculator = _runner_classes()
    targets = [(runner, "execute_model", scopes.EXECUTE), (runner, "sample", scopes.SAMPLE),
               (speculator, "propose", scopes.DRAFT)]
    assert scopes.wrap(targets) == 3
    assert scopes.wrap(targets) == 3  # once: a second install wraps nothing again
    assert runner.__dict__["execute_model"].__wrapped__.__name__ == "execute_model"
    assert not hasattr(runner.__dict__["execute_model"].__wrapped__, "__wrapped__")

    def step():
        r = runner()
        assert r.execute_model(1).tolist() == [2.0, 2.0]  # results pass through
        r.sample(3)
        speculator().propose(1)

    def opened():
        with scopes.opened():
            step()

    assert _ranges(tmp_path, opened) == sorted([(scopes.EXECUTE, "aten::add_"), (scopes.SAMPLE, "aten::mul_"),
                                                (scopes.DRAFT, "aten::sub_")])
    assert _ranges(tmp_path, step) == sorted([(None, "aten::add_"), (None, "aten::mul_"), (None, "aten::sub_")])


def test_a_class_that_does_not_define_the_method_is_left_alone():
    runner, _ = _runner_classes()

    class Child(runner):
        pass

    assert scopes.wrap([(Child, "execute_model", scopes.EXECUTE)]) == 0
    assert "execute_model" not in Child.__dict__


def test_breakdown_reads_each_range_as_its_stage():
    assert breakdown.stage_of(scopes.EXECUTE, "attention") == "target attention"
    assert breakdown.stage_of(scopes.DRAFT, "gemm") == "drafter gemm"
    assert breakdown.stage_of(scopes.SAMPLE, "other") == "sampler and rejection"
