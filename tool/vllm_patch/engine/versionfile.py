"""Read vLLM's version and commit from ``vllm/_version.py`` without importing vLLM."""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class VersionInfo:
    version: str | None
    commit: str | None


def parse_version_file(text: str) -> VersionInfo:
    """Pick ``__version__`` and ``__commit_id__`` string assignments out of the module."""
    found: dict[str, str] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return VersionInfo(None, None)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return VersionInfo(found.get("__version__"), found.get("__commit_id__"))
