"""Patch 0007 on 0.27.1: Model Runner V2 keeps a batch with a prompt chunk out of the uniform decode graphs.

0.27.1's V2 ``execute_model`` (``v1/worker/gpu/model_runner.py:1231-1234``) asks for a uniform decode graph from
the batch's shape alone (``get_uniform_token_count``): every request scheduling ``decode_query_len`` (1 + K)
tokens. A preempted request recomputes its prompt and output in chunks, and a chunk of 1 + K tokens beside verify
rows makes such a batch; it then replays the FULL graph captured for verify rows. 0.32.0 excludes batches with
a prefill (``has_prefill``).

The statements of ``execute_model`` from ``num_reqs = ...`` to the ones that settle ``uniform_tok_count`` are cut
out of the tree's file with ``ast`` (it cannot be imported without vLLM's compiled parts) and run with a stand-in
runner holding only the request states; any runner method they call, and any function or class of vLLM they
reach (``get_uniform_token_count``, 0.32's ``gather_batch_req_state`` and ``sort_batch_req_ids``), is the tree's
own. So the test is the patch's ``Obsolete-If: test`` check on a newer release's unpatched tree too."""

from __future__ import annotations
import __future__

import ast
import builtins
import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.patch("v2-prompt-chunks-out-of-uniform-decode-graphs")]

RUNNER = "vllm/v1/worker/gpu/model_runner.py"
K = 3


class _TreeNames:
    """The module-level names of a tree's file, each the tree's own: a function or class is cut out of the file
    with ``ast`` and compiled alone (annotations unevaluated), the names it reads resolved the same way, through
    the file's own imports (``from vllm.x import y``: y in the tree's ``vllm/x.py``; anything else imported for
    real). A name that cannot be resolved is left out: code that reads it fails with a NameError."""

    def __init__(self, tree: Path) -> None:
        self.tree, self.done, self.index = tree, {}, {}

    def _index(self, relpath: str) -> dict[str, tuple[str, Any]]:
        if relpath not in self.index:
            path = self.tree / relpath
            out: dict[str, tuple[str, Any]] = {}
            for node in ast.parse(path.read_text(), str(path)).body if path.is_file() else []:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    out[node.name] = ("def", node)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for alias in node.names:
                        out[alias.asname or alias.name] = ("from", (node.module, alias.name))
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        out[alias.asname or alias.name.split(".")[0]] = ("import", alias.name)
            self.index[relpath] = out
        return self.index[relpath]

    def scope(self, relpath: str, node: ast.AST) -> dict[str, Any]:
        """The names ``node`` (code of the file ``relpath``) reads that the file defines or imports."""
        wanted = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        out = {}
        for name in sorted(wanted - set(dir(builtins))):
            value = self.resolve(relpath, name)
            if value is not _MISSING:
                out[name] = value
        return out

    def resolve(self, relpath: str, name: str) -> Any:
        key = (relpath, name)
        if key in self.done:
            return self.done[key]
        self.done[key] = _MISSING  # a cycle resolves to nothing
        kind, what = self._index(relpath).get(name, (None, None))
        value: Any = _MISSING
        try:
            if kind == "def":
                scope = {"__builtins__": builtins, **self.scope(relpath, what)}
                module = ast.Module(body=[what], type_ignores=[])
                exec(compile(module, str(self.tree / relpath), "exec",
                             flags=__future__.annotations.compiler_flag, dont_inherit=True), scope)
                value = scope[name]
            elif kind == "from":
                source, attr = what
                if source == "vllm" or source.startswith("vllm."):
                    base = source.replace(".", "/")
                    rel = f"{base}.py" if (self.tree / f"{base}.py").is_file() else f"{base}/__init__.py"
                    value = self.resolve(rel, attr)
                else:
                    value = getattr(importlib.import_module(source), attr)
            elif kind == "import" and not what.startswith("vllm"):
                value = importlib.import_module(what.split(".")[0])
        except Exception:  # noqa: BLE001 - unresolvable here: left out, as documented
            value = _MISSING
        self.done[key] = value
        return value


_MISSING = object()


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
    """The runner's request states; its methods are compiled from the tree's class on first use, the module names
    they read the tree's own (``_TreeNames``)."""

    def __getattr__(self, name: str) -> Any:
        cls = object.__getattribute__(self, "_tree_class")
        names = object.__getattribute__(self, "_names")
        node = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if node is None:
            raise AttributeError(f"the stand-in runner has no {name}")
        fn_node = ast.FunctionDef(**{**{f: getattr(node, f) for f in node._fields}, "decorator_list": []})
        scope = {"__builtins__": builtins, **names.scope(RUNNER, fn_node)}
        exec(compile(ast.fix_missing_locations(ast.Module(body=[fn_node], type_ignores=[])), RUNNER, "exec",
                     flags=__future__.annotations.compiler_flag, dont_inherit=True), scope)
        return scope[name].__get__(self)


def uniform_token_count(tree: Path, rows: list[tuple[int, int, int, int]]) -> int | None:
    """What the tree's V2 runner asks the graph dispatcher for: the uniform token count of a batch of rows
    (tokens scheduled, drafts among them, prompt-and-output tokens computed, tokens to prefill), or None."""
    cls = _runner_class(tree)
    names = _TreeNames(tree)
    ids = [f"r{i}" for i in range(len(rows))]
    # One pipeline stage, no prefill context parallelism, no adaptive verification, no LoRA.
    runner = _Runner(_tree_class=cls, _names=names, decode_query_len=1 + K, use_pp=False, pcp_manager=None,
                     adaptive_verification=None, lora_config=None, req_states=SimpleNamespace(
                         req_id_to_index={r: i for i, r in enumerate(ids)},
                         num_computed_prefill_tokens=np.array([min(c, p) for _, _, c, p in rows], dtype=np.int32),
                         prefill_len=SimpleNamespace(np=np.array([p for *_, p in rows], dtype=np.int32))))
    scheduler_output = SimpleNamespace(
        num_scheduled_tokens={r: n for r, (n, *_) in zip(ids, rows, strict=True)},
        total_num_scheduled_tokens=sum(n for n, *_ in rows),
        scheduled_spec_decode_tokens={r: [0] * d for r, (_, d, *_) in zip(ids, rows, strict=True) if d})
    module = ast.fix_missing_locations(ast.Module(body=_uniform_block(cls), type_ignores=[]))
    scope: dict[str, Any] = {"__builtins__": builtins, **names.scope(RUNNER, module), "self": runner,
                             "scheduler_output": scheduler_output, "dummy_run": False}
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
