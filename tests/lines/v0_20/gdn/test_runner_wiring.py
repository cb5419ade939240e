"""What the patched model runner hands the Mamba2/GDN metadata builders (patches 0004-0006), and which
batches it replays in the FULL graphs of verify batches (patch 0008), on CPU.

``gpu_model_runner.py`` cannot be imported here, so the pieces of the runner that decide it are cut out
of the patched source with ``ast`` and run with stand-ins:

- the ``recover_accepted_state`` expression (steps without drafts that follow accepted drafts);
- the ``extra_attn_metadata_args`` assignment and the ``if``/``elif`` after it in
  ``_build_attn_group_metadata`` (which builder gets which arguments);
- the initial ``num_decode_draft_tokens`` of ``_prepare_inputs`` (which rows the GDN builder verifies
  on the spec path);
- ``execute_model``'s ``force_uniform_decode`` and ``_is_uniform_decode`` (whether a batch of the
  uniform 1 + K shape replays the FULL graphs captured for verify batches).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import runner_dispatch
import verify_dispatch
from verify_dispatch import OTHER_SHAPES, PROMPT_CHUNK_BATCHES, RUNNER, VERIFY_BATCHES, function

pytestmark = pytest.mark.patch(
    "gdn-recover-conv-and-ssm-state-after-spec-decode",
    "gdn-state-recovery-for-mixed-batches-and-zero-draft-rows",
    "gdn-verify-zero-draft-decodes-on-the-spec-path",
    "spec-decode-full-graphs-only-for-verify-batches",
)

METHODS = ["ngram", "mtp", "eagle", "eagle3", "draft_model", "suffix"]


class Mamba2AttentionMetadataBuilder:
    pass


class GDNAttentionMetadataBuilder:
    pass


class OtherBuilder:
    pass


@pytest.fixture(scope="module")
def runner_source(patched_tree: Path) -> ast.Module:
    return verify_dispatch.runner_source(patched_tree)


@pytest.fixture(scope="module")
def recover_expr(runner_source):
    outer = function(runner_source, "_build_attention_metadata")
    for node in outer.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
                "recover_accepted_state"]:
            return compile(ast.Expression(node.value), RUNNER, "eval")
    raise LookupError("no recover_accepted_state in _build_attention_metadata")


@pytest.fixture(scope="module")
def wiring(runner_source):
    """The statements from ``extra_attn_metadata_args = {}`` to the end of the ``if``/``elif`` after it."""
    inner = function(runner_source, "_build_attn_group_metadata")
    body = inner.body
    start = next(i for i, node in enumerate(body) if isinstance(node, ast.Assign)
                 and [getattr(t, "id", None) for t in node.targets] == ["extra_attn_metadata_args"])
    assert isinstance(body[start + 1], ast.If)
    return compile(ast.Module(body=body[start:start + 2], type_ignores=[]), RUNNER, "exec")


class _Buffer:
    """A CpuGpuBuffer stand-in: ``.np``, ``.cpu`` and ``.gpu`` views of the same values."""

    def __init__(self, values):
        self.np = np.array(values, dtype=np.int32)
        self.cpu = self.gpu = self.np


def _runner(accepted, method="ngram", spec=True):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(method=method, num_speculative_tokens=3) if spec else None,
        num_accepted_tokens=_Buffer(accepted),
        num_decode_draft_tokens=_Buffer([-1] * len(accepted)),
    )


def _recover(expr, runner, num_reqs, use_spec_decode=False, for_cudagraph_capture=False) -> bool:
    return eval(expr, {}, dict(self=runner, num_reqs=num_reqs, use_spec_decode=use_spec_decode,
                               for_cudagraph_capture=for_cudagraph_capture))


@pytest.mark.parametrize("method", METHODS)
def test_recovery_after_accepted_drafts_for_every_drafter(recover_expr, method):
    runner = _runner([1, 3, 1, 1], method=method)
    assert _recover(recover_expr, runner, num_reqs=4) is True


def test_no_recovery_when_not_needed(recover_expr):
    assert _recover(recover_expr, _runner([1, 1, 1]), num_reqs=3) is False  # nothing accepted beyond 1
    assert _recover(recover_expr, _runner([1, 1, 4]), num_reqs=2) is False  # only past num_reqs
    assert _recover(recover_expr, _runner([2, 2]), num_reqs=2, use_spec_decode=True) is False  # spec wiring
    assert _recover(recover_expr, _runner([2, 2]), num_reqs=2, for_cudagraph_capture=True) is False
    assert _recover(recover_expr, _runner([2, 2], spec=False), num_reqs=2) is False


def _extra(wiring, builder, use_spec_decode, recover, ubid=None, accepted=(1, 3, 1)):
    scope = dict(builder=builder, use_spec_decode=use_spec_decode, recover_accepted_state=recover, ubid=ubid,
                 self=_runner(list(accepted)), num_reqs_padded=len(accepted),
                 Mamba2AttentionMetadataBuilder=Mamba2AttentionMetadataBuilder,
                 GDNAttentionMetadataBuilder=GDNAttentionMetadataBuilder)
    exec(wiring, {}, scope)
    return scope["extra_attn_metadata_args"]


def test_spec_step_arguments(wiring):
    gdn = _extra(wiring, GDNAttentionMetadataBuilder(), use_spec_decode=True, recover=False)
    assert sorted(gdn) == ["num_accepted_tokens", "num_accepted_tokens_cpu", "num_decode_draft_tokens_cpu"]
    mamba2 = _extra(wiring, Mamba2AttentionMetadataBuilder(), use_spec_decode=True, recover=False)
    assert sorted(mamba2) == ["num_accepted_tokens", "num_decode_draft_tokens_cpu"]
    assert _extra(wiring, OtherBuilder(), use_spec_decode=True, recover=False) == {}


def test_non_spec_step_arguments(wiring):
    for builder in (GDNAttentionMetadataBuilder(), Mamba2AttentionMetadataBuilder()):
        extra = _extra(wiring, builder, use_spec_decode=False, recover=True)
        assert list(extra) == ["num_accepted_tokens"]
        assert list(extra["num_accepted_tokens"]) == [1, 3, 1]
        assert _extra(wiring, builder, use_spec_decode=False, recover=False) == {}
        assert _extra(wiring, builder, use_spec_decode=False, recover=True, ubid=0) == {}
    assert _extra(wiring, OtherBuilder(), use_spec_decode=False, recover=True) == {}


def _else_branch_with(fn: ast.FunctionDef, name: str) -> list[ast.stmt]:
    """The statements of the ``if``/``else`` branch of ``fn`` that assigns ``name``."""
    for node in ast.walk(fn):
        if isinstance(node, ast.If):
            for body in (node.body, node.orelse):
                if any(isinstance(s, ast.Assign) and [getattr(t, "id", None) for t in s.targets] == [name]
                       for s in body):
                    return body
    raise LookupError(f"no branch assigning {name}")


@pytest.fixture(scope="module")
def draft_marks(runner_source):
    """``_prepare_inputs``'s statements that compute ``num_decode_draft_tokens`` on a spec step: from
    ``num_draft_tokens = ...`` to the call of ``_calc_spec_decode_metadata``, run as they stand."""
    body = _else_branch_with(function(runner_source, "_prepare_inputs"), "num_decode_draft_tokens")
    end = next(i for i, node in enumerate(body) if isinstance(node, ast.Assign)
               and [getattr(t, "id", None) for t in node.targets] == ["spec_decode_metadata"])
    return compile(ast.Module(body=body[:end], type_ignores=[]), RUNNER, "exec")


def _marks(draft_marks, computed, prompt, scheduled, drafts: dict[int, int], num_reqs=None):
    """``num_decode_draft_tokens`` for requests ``0..n-1``; ``drafts`` maps a request to its draft count."""
    n = len(computed)
    batch = SimpleNamespace(num_computed_tokens_cpu=np.array(computed + [99], dtype=np.int32),
                            num_prompt_tokens=np.array(prompt + [1], dtype=np.int32),
                            req_id_to_index={f"r{i}": i for i in range(n)})
    scheduler_output = SimpleNamespace(
        scheduled_spec_decode_tokens={f"r{i}": [7] * k for i, k in drafts.items()})
    scope = dict(self=SimpleNamespace(input_batch=batch), num_reqs=n if num_reqs is None else num_reqs,
                 scheduler_output=scheduler_output, num_scheduled_tokens=np.array(scheduled, dtype=np.int32))
    exec(draft_marks, {"np": np}, scope)
    marks = scope["num_decode_draft_tokens"]
    assert marks.dtype == np.int32
    return marks.tolist()


def test_decodes_without_drafts_count_zero(draft_marks):
    """Rows past their prompt scheduled one token start at 0 (a 0-draft spec row for the GDN builder),
    prefilling rows at -1, rows with drafts at their draft count."""
    assert _marks(draft_marks, computed=[40, 12, 30, 7], prompt=[20, 12, 64, 9], scheduled=[1, 1, 16, 2],
                  drafts={}) == [0, 0, -1, -1]
    assert _marks(draft_marks, computed=[40, 50, 30], prompt=[20, 12, 64], scheduled=[4, 1, 16],
                  drafts={0: 3}) == [3, 0, -1]


def test_rows_recomputing_several_tokens_stay_off_the_spec_path(draft_marks):
    """A request past its prompt scheduled more than one token without drafts (recomputing its output
    after preemption, or in chunks) keeps -1: the spec partition has one state column per draft plus one."""
    assert _marks(draft_marks, computed=[40, 25, 33], prompt=[20, 12, 30], scheduled=[5, 2, 1],
                  drafts={}) == [-1, -1, 0]


def test_draft_rows_need_drafts_plus_one_scheduled_tokens(draft_marks):
    """A row with drafts is a spec row only when it is scheduled exactly its drafts plus one tokens."""
    assert _marks(draft_marks, computed=[40, 40, 10], prompt=[20, 20, 30], scheduled=[4, 6, 4],
                  drafts={0: 3, 1: 3, 2: 3}) == [3, -1, -1]


@pytest.fixture(scope="module")
def uniform(patched_tree: Path):
    """Whether a batch replays the FULL graph of verify batches, decided by the tree's own runner code
    (``runner_dispatch``, as the current line's 0004 is judged): on the release a prompt chunk of the verify
    shape does."""
    return runner_dispatch.uniform_decode(patched_tree)


def test_verify_batches_replay_the_uniform_decode_graph(uniform):
    for scheduled, drafts, k in VERIFY_BATCHES:
        assert uniform(scheduled, drafts, k), (scheduled, drafts)


def test_a_prompt_chunk_of_the_verify_shape_is_a_mixed_batch(uniform):
    for scheduled, drafts, k in PROMPT_CHUNK_BATCHES:
        assert not uniform(scheduled, drafts, k), f"{scheduled} with drafts {drafts} replays the verify graph"


def test_batches_of_other_shapes_are_left_to_the_release(uniform):
    for scheduled, drafts, k in OTHER_SHAPES:
        assert not uniform(scheduled, drafts, k), (scheduled, drafts)
    assert uniform([1, 1, 1], {}, 0), "one-token decodes without speculation lost their FULL graphs"
