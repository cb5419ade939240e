"""Patch 0007 on 0.27.1: Model Runner V2 keeps a batch with a prompt chunk out of the uniform decode graphs.

0.27.1's V2 ``execute_model`` (``v1/worker/gpu/model_runner.py:1231-1234``) asks for a uniform decode graph from
the batch's shape alone (``get_uniform_token_count``): every request scheduling ``decode_query_len`` (1 + K)
tokens. A preempted request recomputes its prompt and output in chunks, and a chunk of 1 + K tokens beside verify
rows makes such a batch; it then replays the FULL graph captured for verify rows. 0.32.0 excludes batches with
a prefill (``has_prefill``).

The statements of ``execute_model`` from ``num_reqs = ...`` to the ones that settle ``uniform_tok_count`` are cut
out of the tree's file with ``ast`` (it cannot be imported without vLLM's compiled parts) and run with a stand-in
runner holding only the request states; any runner method they call is the tree's own."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.integration

RUNNER = "vllm/v1/worker/gpu/model_runner.py"
K = 3


def _get_uniform_token_count(num_reqs: int, num_tokens: int, max_query_len: int) -> int | None:
    """0.27.1's ``cudagraph_utils.get_uniform_token_count``."""
    uniform = max_query_len == num_tokens // num_reqs and num_tokens == max_query_len * num_reqs
    return max_query_len if uniform else None


def _runner_class(tree: Path) -> ast.ClassDef:
    path = tree / RUNNER
    source = ast.parse(path.read_text(), str(path))
    return next(n for n in source.body if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner")


def _uniform_block(cls: ast.ClassDef) -> list[ast.stmt]:
    execute = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "execute_model")
    body = execute.body
    start = next(i for i, s in enumerate(body) if isinstance(s, ast.Assign)
                 and [getattr(t, "id", None) for t in s.targets] == ["num_reqs"])
    end = next(i for i in range(start, len(body)) if isinstance(body[i], ast.Assign)
               and [getattr(t, "id", None) for t in body[i].targets] == ["num_active_loras"])
    return body[start:end]


class _Runner(SimpleNamespace):
    """The runner's request states; its methods are compiled from the tree's class on first use."""

    def __getattr__(self, name: str) -> Any:
        cls = object.__getattribute__(self, "_tree_class")
        node = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if node is None:
            raise AttributeError(f"the stand-in runner has no {name}")
        scope: dict[str, Any] = {"np": np, "Any": Any, "SchedulerOutput": object}
        fn_node = ast.FunctionDef(**{**{f: getattr(node, f) for f in node._fields}, "decorator_list": []})
        exec(compile(ast.fix_missing_locations(ast.Module(body=[fn_node], type_ignores=[])), RUNNER, "exec"), scope)
        return scope[name].__get__(self)


def uniform_token_count(tree: Path, rows: list[tuple[int, int, int, int]]) -> int | None:
    """What the tree's V2 runner asks the graph dispatcher for: the uniform token count of a batch of rows
    (tokens scheduled, drafts among them, prompt-and-output tokens computed, tokens to prefill), or None."""
    cls = _runner_class(tree)
    ids = [f"r{i}" for i in range(len(rows))]
    runner = _Runner(_tree_class=cls, req_states=SimpleNamespace(
        req_id_to_index={r: i for i, r in enumerate(ids)},
        num_computed_prefill_tokens=np.array([min(c, p) for _, _, c, p in rows], dtype=np.int32),
        prefill_len=SimpleNamespace(np=np.array([p for *_, p in rows], dtype=np.int32))))
    scheduler_output = SimpleNamespace(
        num_scheduled_tokens={r: n for r, (n, *_) in zip(ids, rows, strict=True)},
        total_num_scheduled_tokens=sum(n for n, *_ in rows),
        scheduled_spec_decode_tokens={r: [0] * d for r, (_, d, *_) in zip(ids, rows, strict=True) if d})
    scope: dict[str, Any] = {"self": runner, "scheduler_output": scheduler_output, "dummy_run": False,
                             "get_uniform_token_count": _get_uniform_token_count, "np": np}
    module = ast.fix_missing_locations(ast.Module(body=_uniform_block(cls), type_ignores=[]))
    exec(compile(module, str(tree / RUNNER), "exec"), scope)
    return scope["uniform_tok_count"]


def test_verify_rows_replay_the_uniform_decode_graph(v027_tree):
    # Two verify rows: 1 + K tokens each, prompts done.
    assert uniform_token_count(v027_tree, [(1 + K, K, 50, 40), (1 + K, K, 60, 40)]) == 1 + K


def test_a_preempted_requests_chunk_keeps_the_batch_out_of_it(v027_tree):
    # A verify row and a preempted request recomputing its prompt and output (120 tokens), 1 + K of them now.
    assert uniform_token_count(v027_tree, [(1 + K, K, 50, 40), (1 + K, 0, 36, 120)]) is None
    # A new prompt's first chunk of 1 + K tokens.
    assert uniform_token_count(v027_tree, [(1 + K, K, 50, 40), (1 + K, 0, 0, 9)]) is None


def test_a_prompts_last_token_with_placeholder_drafts_runs_as_a_decode(v027_tree):
    # One new prompt token over existing context, padded with K placeholder drafts (the scheduler's async padding).
    assert uniform_token_count(v027_tree, [(1 + K, K, 50, 40), (1 + K, K, 39, 40)]) == 1 + K
