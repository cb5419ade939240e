"""The batches whose FULL CUDA graph dispatch the verify-graph fix decides (the 0.20 line's patch 0008, the current
line's 0004), and the model runner's source as an ``ast`` tree. The decision itself is run from a tree's own
code by ``runner_dispatch``.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
