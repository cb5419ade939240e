"""Whether Model Runner V1 replays a batch in the FULL CUDA graphs of uniform decode (verify) batches, decided by
the tree's own code: the statements of ``execute_model`` from the batch's shape to its call of
``_determine_batch_execution_and_padding``, then that method up to the CUDA-graph dispatcher, whose
``uniform_decode`` argument is the answer. Cut out of ``vllm/v1/worker/gpu_model_runner.py`` with ``ast`` (the
file cannot be imported without vLLM's compiled parts) and run with a stand-in runner that holds only data;
every runner method those statements call is the tree's own, whatever its name (``_is_uniform_decode``, a
helper a fix adds), except the input preparation, which touches the GPU and decides nothing here. So a fix
judges by what it does, wherever in the runner it makes the decision.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

RUNNER = "vllm/v1/worker/gpu_model_runner.py"
DISPATCH = "_determine_batch_execution_and_padding"
# Runner methods that move data to the GPU and decide nothing about the dispatch.
# (_prepare_inputs returns as many values as the tree's execute_model unpacks: uniform_decode sets it.)
STUBBED = {"_allow_microbatching": lambda *a, **k: False,
           "_pad_for_sequence_parallelism": lambda num_tokens: num_tokens}


class _Dispatched(Exception):
    def __init__(self, uniform_decode: bool) -> None:
        self.uniform_decode = uniform_decode


def _calls_dispatch(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == DISPATCH and getattr(n.value, "id", None) == "self"
               for n in ast.walk(stmt))


def _block(execute: ast.FunctionDef) -> list[ast.stmt]:
    """execute_model's statements from ``num_reqs = ...`` to the one that calls the dispatch."""
    for node in ast.walk(execute):
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list) or node is execute:
                continue
            end = next((i for i, s in enumerate(stmts) if _calls_dispatch(s)), None)
            if end is None or any(_calls_dispatch(s) for s in stmts[end + 1:]) or not isinstance(stmts[end],
                                                                                               ast.Assign):
                continue
            start = next((i for i, s in enumerate(stmts[:end]) if isinstance(s, ast.Assign)
                          and [getattr(t, "id", None) for t in s.targets] == ["num_reqs"]), None)
            if start is not None:
                return stmts[start:end + 1]
    raise LookupError(f"execute_model calls no self.{DISPATCH} after setting num_reqs")


def _methods(source: ast.Module) -> dict[str, ast.FunctionDef]:
    cls = next(n for n in ast.walk(source) if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner")
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


class _Runner(SimpleNamespace):
    """The runner's data; its methods are bound from the tree's class on first use."""

    def __getattr__(self, name: str) -> Any:
        methods = object.__getattribute__(self, "_tree_methods")
        if name in STUBBED:
            return STUBBED[name]
        if name not in methods:
            raise AttributeError(f"the stand-in runner has no {name}")
        node = methods[name]
        static = any(getattr(d, "id", None) == "staticmethod" for d in node.decorator_list)
        fn_node = ast.FunctionDef(**{**{f: getattr(node, f) for f in node._fields}, "decorator_list": []})
        scope: dict[str, Any] = dict(GLOBALS)
        exec(compile(ast.fix_missing_locations(ast.Module(body=[fn_node], type_ignores=[])), RUNNER, "exec"),
             scope)
        fn = scope[name]
        return fn if static else fn.__get__(self)


GLOBALS: dict[str, Any] = {"np": np, "Any": Any}


def _prepared_values(block: list[ast.stmt]) -> int:
    """How many values the block unpacks from ``self._prepare_inputs(...)`` (3 on 0.33, 2 on 0.27)."""
    for stmt in block:
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                and getattr(stmt.value.func, "attr", None) == "_prepare_inputs"
                and isinstance(stmt.targets[0], ast.Tuple)):
            return len(stmt.targets[0].elts)
    return 3


def uniform_decode(tree: Path) -> Callable[[list[int], dict[int, int], int], bool]:
    """A function of a batch (tokens scheduled per request; drafts per request index, absent = none; K) that
    says whether the tree's V1 runner dispatches it as uniform decode."""
    path = tree / RUNNER
    source = ast.parse(path.read_text(), str(path))
    methods = _methods(source)
    stmts = _block(methods["execute_model"])
    prepared = (None,) * _prepared_values(stmts)
    block = compile(ast.Module(body=stmts, type_ignores=[]), RUNNER, "exec")

    def decide(scheduled: list[int], drafts: dict[int, int], k: int) -> bool:
        req_ids = [f"r{i}" for i in range(len(scheduled))]
        dispatcher = SimpleNamespace(dispatch=lambda **kw: (_ for _ in ()).throw(_Dispatched(kw["uniform_decode"])))
        runner = _Runner(
            _tree_methods=methods, num_spec_tokens=k, uniform_decode_query_len=1 + k,
            _prepare_inputs=lambda *a, **kw: prepared, cascade_attn_enabled=False,
            input_batch=SimpleNamespace(num_reqs=len(scheduled), req_ids=req_ids, lora_id_to_lora_request={}),
            model_config=SimpleNamespace(is_encoder_decoder=False),
            vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=1)),
            cudagraph_dispatcher=dispatcher)
        scheduler_output = SimpleNamespace(
            num_scheduled_tokens=dict(zip(req_ids, scheduled, strict=True)),
            total_num_scheduled_tokens=sum(scheduled),
            scheduled_spec_decode_tokens={f"r{i}": [7] * n for i, n in drafts.items()},
            scheduled_encoder_inputs={})
        scope = {**GLOBALS, "self": runner, "scheduler_output": scheduler_output}
        try:
            exec(block, scope)  # one namespace: comprehensions in the block see its names
        except _Dispatched as found:
            return bool(found.uniform_decode)
        raise AssertionError(f"execute_model reached no CUDA-graph dispatch for {scheduled}")

    return decide
