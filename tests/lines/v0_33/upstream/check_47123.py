"""Proof that the #47123 stand-in (``47123.diff``) dispatches as patch 0004 does, on the cases of
``tests/verify_dispatch.py``. Not collected by default; run it by path:

    pytest tests/lines/v0_33/upstream/check_47123.py

The stand-in decides in ``_is_uniform_decode`` (given the number of requests scheduled as their drafts + 1
tokens, counted in ``execute_model``), not through ``force_uniform_decode`` as 0004 does, so
``verify_dispatch.uniform_dispatch`` (which looks for 0004's shape) cannot read it: here the counting block
and ``_is_uniform_decode`` are cut out of the tree with ``ast`` and run on the same batches.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import verify_dispatch

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def dispatch(v033_pristine_tree, tmp_path_factory):
    dest = tmp_path_factory.mktemp("v033-47123")
    (dest / Path(verify_dispatch.RUNNER).parent).mkdir(parents=True)
    shutil.copy(v033_pristine_tree / verify_dispatch.RUNNER, dest / verify_dispatch.RUNNER)
    diff = str(HERE / "47123.diff")
    subprocess.run(["git", "apply", diff] if shutil.which("git") else ["patch", "-p1", "-s", "-i", diff],
                   cwd=dest, check=True)
    source = verify_dispatch.runner_source(dest)
    execute = verify_dispatch.function(source, "execute_model")
    block = None
    for node in ast.walk(execute):
        for stmts in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if isinstance(stmts, list):
                for i, s in enumerate(stmts):
                    if block is None and isinstance(s, ast.Assign) and [
                            getattr(t, "id", None) for t in s.targets] == ["num_draft_decode_reqs"]:
                        block = stmts[i:i + 2]  # the outermost: "= None" and the "if" that counts
    assert block, "execute_model counts no num_draft_decode_reqs"
    fn = verify_dispatch.function(source, "_is_uniform_decode")
    fn.decorator_list = []
    helpers: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), verify_dispatch.RUNNER, "exec"), {}, helpers)
    counting = compile(ast.Module(body=block, type_ignores=[]), verify_dispatch.RUNNER, "exec")
    return counting, helpers["_is_uniform_decode"]


def _uniform(dispatch, scheduled, drafts, k):
    block, is_uniform = dispatch
    req_ids = [f"r{i}" for i in range(len(scheduled))]
    scope = dict(self=SimpleNamespace(num_spec_tokens=k), req_ids=req_ids, tokens=list(scheduled),
                 scheduler_output=SimpleNamespace(
                     scheduled_spec_decode_tokens={f"r{i}": [7] * n for i, n in drafts.items()}))
    exec(block, scope)  # one namespace: the generator in the count sees the locals
    return is_uniform(max(scheduled), 1 + k, sum(scheduled), len(scheduled),
                      num_draft_decode_reqs=scope["num_draft_decode_reqs"])


def test_verify_batches_replay_the_uniform_decode_graph(dispatch):
    for scheduled, drafts, k in verify_dispatch.VERIFY_BATCHES:
        assert _uniform(dispatch, scheduled, drafts, k), (scheduled, drafts)


def test_a_prompt_chunk_of_the_verify_shape_is_a_mixed_batch(dispatch):
    for scheduled, drafts, k in verify_dispatch.PROMPT_CHUNK_BATCHES:
        assert not _uniform(dispatch, scheduled, drafts, k), (scheduled, drafts)


def test_other_shapes_and_plain_decodes(dispatch):
    for scheduled, drafts, k in verify_dispatch.OTHER_SHAPES:
        assert not _uniform(dispatch, scheduled, drafts, k), (scheduled, drafts)
    # Without speculative decoding nothing is counted and one-token decodes stay uniform.
    assert _uniform(dispatch, [1, 1, 1], {}, 0)
    # Capture forces the answer either way.
    _, is_uniform = dispatch
    assert is_uniform(4, 4, 4, 1, force_uniform_decode=True, num_draft_decode_reqs=0)
