"""Helpers of the doctor's tests (tests/doctor/conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import re
from pathlib import Path


def absolute_paths(data) -> list[str]:
    """Every absolute path in the strings of a JSON document."""
    found: list[str] = []
    if isinstance(data, str):
        found += re.findall(r"(?<![\w.:/-])/(?:[\w.+@-]+/)*[\w.+@-]+", data)
    elif isinstance(data, dict):
        for value in data.values():
            found += absolute_paths(value)
    elif isinstance(data, list):
        for value in data:
            found += absolute_paths(value)
    return found


def tiny_model(root: Path, heads: int = 4, kv_heads: int = 2, head_dim: int = 16) -> Path:
    """A model directory whose config.json gives a small attention geometry (the interpreter's check is slow)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(
        f'{{"model_type": "llama", "num_attention_heads": {heads}, "num_key_value_heads": {kv_heads}, '
        f'"head_dim": {head_dim}, "hidden_size": {heads * head_dim}, "torch_dtype": "float16"}}')
    return root
