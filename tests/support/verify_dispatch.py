"""Which batches vLLM's model runner (V1) replays in the FULL CUDA graphs of verify batches, cut out of a
tree's ``vllm/v1/worker/gpu_model_runner.py`` with ``ast`` and run with stand-ins (the file cannot be
imported without vLLM's compiled parts): ``execute_model``'s ``force_uniform_decode`` block, and the runner's
``_is_uniform_decode`` and ``_only_verify_rows``. Shared by the 0.20 line's patch 0008 and its port to 0.33.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import CodeType, SimpleNamespace
from typing import Any

RUNNER = "vllm/v1/worker/gpu_model_runner.py"

# (tokens scheduled per request, drafts per request index, K). Every request verifying K drafts: the FULL
# graph of uniform decode batches, as the releases do.
VERIFY_BATCHES = [([4] * 8, {i: 3 for i in range(8)}, 3), ([9, 9], {0: 8, 1: 8}, 8)]
# The shape of a verify batch with a prompt chunk of 1 + K tokens in it (a short prompt, a chunked
# prompt's tail, a recomputation after preemption), or a row with fewer drafts: a mixed batch.
PROMPT_CHUNK_BATCHES = [([4] * 8, {i: 3 for i in range(7)}, 3), ([4], {}, 3), ([4, 4], {0: 3, 1: 2}, 3)]
# Rows of different lengths: not uniform either way.
OTHER_SHAPES = [([4, 2], {0: 3, 1: 1}, 3)]


def function(tree: ast.AST, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no function {name}")


def runner_source(tree: Path) -> ast.Module:
    path = tree / RUNNER
    return ast.parse(path.read_text(), str(path))


def _is_force_assign(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["force_uniform_decode"]


def uniform_dispatch(source: ast.Module) -> tuple[CodeType, dict[str, Any]]:
    """``execute_model``'s statements from ``force_uniform_decode = None`` to the ``if`` that may set it,
    compiled, and the runner's ``_is_uniform_decode`` and ``_only_verify_rows`` as plain functions.
    A LookupError where ``execute_model`` sets no ``force_uniform_decode`` (the releases)."""
    execute = function(source, "execute_model")
    body = None
    for node in ast.walk(execute):  # breadth first: the outermost block that assigns it
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if body is None and isinstance(stmts, list) and any(_is_force_assign(s) for s in stmts):
                body = stmts
    if body is None:
        raise LookupError("execute_model sets no force_uniform_decode")
    start = next(i for i, s in enumerate(body) if _is_force_assign(s))
    block = compile(ast.Module(body=body[start:start + 2], type_ignores=[]), RUNNER, "exec")
    helpers: dict[str, Any] = {}
    for name in ("_is_uniform_decode", "_only_verify_rows"):
        fn = function(source, name)
        fn.decorator_list = []
        exec(compile(ast.Module(body=[fn], type_ignores=[]), RUNNER, "exec"), {}, helpers)
    calls = [c for c in ast.walk(execute) if isinstance(c, ast.Call)
             and getattr(c.func, "attr", None) == "_determine_batch_execution_and_padding"]
    if not any(k.arg == "force_uniform_decode" and getattr(k.value, "id", None) == "force_uniform_decode"
               for c in calls for k in c.keywords):
        raise LookupError("the dispatch does not get force_uniform_decode")
    return block, helpers


def replays_verify_graph(dispatch: tuple[CodeType, dict[str, Any]], scheduled: list[int], drafts: dict[int, int],
                         k: int = 3) -> bool:
    """Whether a batch (tokens scheduled per request; drafts per request index, absent = none) with K drafts
    a step counts as uniform decode, i.e. replays the FULL graph of verify batches."""
    block, helpers = dispatch
    req_ids = [f"r{i}" for i in range(len(scheduled))]
    runner = SimpleNamespace(num_spec_tokens=k, uniform_decode_query_len=1 + k,
                             _only_verify_rows=helpers["_only_verify_rows"])
    scheduler_output = SimpleNamespace(scheduled_spec_decode_tokens={f"r{i}": [7] * n for i, n in drafts.items()})
    scope = dict(self=runner, req_ids=req_ids, scheduler_output=scheduler_output,
                 max_num_scheduled_tokens=max(scheduled), num_reqs=len(scheduled))
    exec(block, {}, scope)
    return helpers["_is_uniform_decode"](max(scheduled), 1 + k, sum(scheduled), len(scheduled),
                                         scope["force_uniform_decode"])


def forced_without_spec(dispatch: tuple[CodeType, dict[str, Any]]) -> bool | None:
    """``force_uniform_decode`` for a one-token step without speculative decoding (must stay None)."""
    block, helpers = dispatch
    scope = dict(self=SimpleNamespace(num_spec_tokens=0, uniform_decode_query_len=1,
                                      _only_verify_rows=helpers["_only_verify_rows"]),
                 req_ids=["r0"], scheduler_output=SimpleNamespace(scheduled_spec_decode_tokens={}),
                 max_num_scheduled_tokens=1, num_reqs=1)
    exec(block, {}, scope)
    return scope["force_uniform_decode"]


def assert_verify_batches_replay(dispatch: tuple[CodeType, dict[str, Any]]) -> None:
    for scheduled, drafts, k in VERIFY_BATCHES:
        assert replays_verify_graph(dispatch, scheduled, drafts, k), (scheduled, drafts)


def assert_prompt_chunks_are_mixed(dispatch: tuple[CodeType, dict[str, Any]]) -> None:
    for scheduled, drafts, k in PROMPT_CHUNK_BATCHES:
        assert not replays_verify_graph(dispatch, scheduled, drafts, k), (scheduled, drafts)


def assert_other_shapes_left_alone(dispatch: tuple[CodeType, dict[str, Any]]) -> None:
    for scheduled, drafts, k in OTHER_SHAPES:
        assert not replays_verify_graph(dispatch, scheduled, drafts, k), (scheduled, drafts)
    assert forced_without_spec(dispatch) is None
