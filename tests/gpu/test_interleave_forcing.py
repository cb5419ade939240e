"""The pure parts of the benchmark's interleaving and of the forced-decode logits processor.

`ForceTokens` runs inside vLLM on the GPU host; here vLLM's logits-processor module is replaced by
stand-ins of its three types (the batch-update record, the move direction and the base class), so
the processor's own bookkeeping (rows added, removed, moved and swapped) runs as vLLM drives it.
"""

from __future__ import annotations

import enum
import importlib
import sys
import types
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from harness.interleave import describe_platforms, ratio_of_medians, rotations, spread


def test_spread_and_ratio_of_medians():
    s = spread([10.0, 30.0, 20.0, 50.0, 40.0])
    assert (s.low, s.median, s.high) == (10.0, 30.0, 50.0)
    assert ratio_of_medians([3.0, 4.0, 5.0], [1.0, 2.0, 9.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        spread([])


def test_rotations_start_each_round_elsewhere():
    order = rotations(["a", "b", "c"], 4)
    assert order == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert all(sorted(r) == ["a", "b", "c"] for r in order)


@pytest.fixture
def forcing(monkeypatch):
    class MoveDirectionality(enum.Enum):
        UNIDIRECTIONAL = 1
        SWAP = 2

    @dataclass(frozen=True)
    class BatchUpdate:
        batch_size: int
        removed: list
        added: list
        moved: list

    fake = types.ModuleType("vllm.v1.sample.logits_processor")
    fake.BatchUpdate, fake.MoveDirectionality, fake.LogitsProcessor = BatchUpdate, MoveDirectionality, object
    for name in ("vllm", "vllm.v1", "vllm.v1.sample"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.logits_processor", fake)
    monkeypatch.delitem(sys.modules, "harness.forcing", raising=False)
    module = importlib.import_module("harness.forcing")
    return module, BatchUpdate, MoveDirectionality


def params(tokens):
    return SimpleNamespace(extra_args=None if tokens is None else {"force_tokens": tokens})


def test_force_tokens_follows_rows_through_batch_changes(forcing):
    module, BatchUpdate, Move = forcing
    proc = module.ForceTokens(None, torch.device("cpu"), False)
    out_a, out_b, out_c = [], [7], []
    proc.update_state(BatchUpdate(3, [], [(0, params([5, 6]), None, out_a), (1, params([1, 2, 3]), None, out_b),
                                         (2, params(None), None, out_c)], []))
    logits = proc.apply(torch.zeros(3, 8))
    assert logits[0].argmax() == 5 and logits[0, 5] == 0 and torch.isinf(logits[0, 4])
    assert logits[1].argmax() == 2  # step 1 of request b: its second forced token
    assert torch.equal(logits[2], torch.zeros(8))  # a request without forced tokens is left alone
    proc.update_state(BatchUpdate(3, [], [], [(0, 1, Move.SWAP)]))
    logits = proc.apply(torch.zeros(3, 8))
    assert logits[0].argmax() == 2 and logits[1].argmax() == 5
    proc.update_state(BatchUpdate(2, [0], [], [(1, 0, Move.UNIDIRECTIONAL)]))
    out_a.extend([5, 6])  # request a has every forced token: no more forcing
    assert torch.equal(proc.apply(torch.zeros(2, 8))[0], torch.zeros(8))


def test_forced_gaps_score_each_token_against_the_top(forcing):
    module, _, _ = forcing
    lp = lambda v: SimpleNamespace(logprob=v)  # noqa: E731
    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[3, 4], logprobs=[
        {3: lp(-0.1), 9: lp(-2.6)}, {9: lp(-0.2), 4: lp(-20.2)}])])
    (scored,) = module.forced_gaps([out], [[3, 4]])
    assert scored["followed"] and scored["gap"] == [0.0, pytest.approx(20.0)]
    assert scored["margin"] == [pytest.approx(2.5), pytest.approx(20.0)]
    (other,) = module.forced_gaps([out], [[3, 5]])
    assert not other["followed"]


def test_the_platform_line_names_each_card_and_stack_once_and_says_unknown_without_one():
    h200 = {"ready": True, "device": "NVIDIA H200", "torch": "2.14.0+cu130", "triton": "3.8.0"}
    assert describe_platforms([h200, dict(h200)]) == "NVIDIA H200 (torch 2.14.0+cu130, Triton 3.8.0)"
    h100 = {**h200, "device": "NVIDIA H100 80GB HBM3"}
    assert describe_platforms([h200, h100]) == ("NVIDIA H200 (torch 2.14.0+cu130, Triton 3.8.0); "
                                                "NVIDIA H100 80GB HBM3 (torch 2.14.0+cu130, Triton 3.8.0)")
    failed = {"error": {"type": "RuntimeError", "message": "boot", "at": None}}
    assert describe_platforms([failed]) == "unknown"
    assert describe_platforms([failed, h200]) == "NVIDIA H200 (torch 2.14.0+cu130, Triton 3.8.0)"


def test_an_engine_reports_the_card_and_stack_it_runs_on():
    import triton

    from harness.serve import platform

    here = platform()
    assert here["device"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    assert (here["torch"], here["triton"]) == (torch.__version__, triton.__version__)
    assert describe_platforms([{"ready": True, **here}]).startswith(f"{here['device']} (torch {torch.__version__}")


def test_an_answer_reaches_the_controller_while_the_engine_process_waits():
    """Fleet reads one line per command from a pipe while the engine process lives on: an answer left in
    Python's buffer would hang the benchmark."""
    import os
    import select
    import subprocess
    from pathlib import Path

    gpu = Path(__file__).resolve().parents[2] / "gpu"
    code = "import sys, time; from harness.serve import _say; _say({'ready': True}); time.sleep(300)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe buffers, as on a GPU host
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=gpu, env=env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no answer within 30 s while the engine process waits"
        assert proc.stdout.readline() == '{"ready": true}\n'
    finally:
        proc.kill()
        proc.wait()
