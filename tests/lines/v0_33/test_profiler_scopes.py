"""The benchmarks' breakdown on Model Runner V2 (gpu/harness/scopes.py) names the steps of this release's runner:
each method it wraps is defined where it looks for it, so a renamed method shows here, not as a breakdown whose
kernels all land outside any stage on the GPU host."""

from __future__ import annotations

import ast
from pathlib import Path

RUNNER = "vllm/v1/worker/gpu/model_runner.py"
SPECULATOR = "vllm/v1/worker/gpu/spec_decode/speculator.py"


def _methods(path: Path, cls: str) -> set[str]:
    tree = ast.parse(path.read_text())
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    assert found, f"no class {cls} in {path.name}"
    return {n.name for n in found[0].body if isinstance(n, ast.FunctionDef)}


def test_the_v2_runner_defines_the_steps_the_breakdown_wraps(v033_pristine_tree: Path):
    assert {"execute_model", "sample"} <= _methods(v033_pristine_tree / RUNNER, "GPUModelRunner")
    assert "propose" in _methods(v033_pristine_tree / SPECULATOR, "BaseSpeculator")
