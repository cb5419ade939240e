"""``EngineArgs.create_engine_config``: TurboQuant no longer refuses hybrid models, and fills the skip list
with the hybrid's boundary attention layers.

The TurboQuant block of ``create_engine_config`` (the ``if resolved_cache_dtype.startswith("turboquant_")``
statement that computes the skip list) is run as the tree has it, against stand-ins for the model and
cache configs and the tree's own ``TurboQuantConfig``.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers
from tree_exec import exec_block, find_statement

from harness.models import LLAMA6, QWEN3_NEXT12

pytestmark = pytest.mark.patch("turboquant-on-hybrid-attention-gdn-models")

ARG_UTILS = "vllm/engine/arg_utils.py"


def _raise_messages(tree: Path) -> list[str]:
    """The text of every string constant inside a ``raise`` of arg_utils.py."""
    module = ast.parse((tree / ARG_UTILS).read_text())
    out = []
    for node in ast.walk(module):
        if isinstance(node, ast.Raise) and node.exc is not None:
            out.append("".join(c.value for c in ast.walk(node.exc)
                               if isinstance(c, ast.Constant) and isinstance(c.value, str)))
    return out


def test_hybrid_refusal_is_gone(patched_tree: Path) -> None:
    messages = _raise_messages(patched_tree)
    assert not [m for m in messages if "requires uniform attention layers" in m]
    assert not [m for m in messages if "not supported for hybrid" in m]


def test_release_refuses_hybrid(pristine_tree: Path) -> None:
    """What the patch removes (a guard for this test's own AST reading)."""
    assert [m for m in _raise_messages(pristine_tree) if "requires uniform attention layers" in m]


def _turboquant_block(tree: Path) -> ast.stmt:
    return find_statement(
        tree, ARG_UTILS, "EngineArgs.create_engine_config",
        lambda node, src: isinstance(node, ast.If)
        and src.startswith('if resolved_cache_dtype.startswith("turboquant_")')
        and "get_boundary_skip_layers" in src,
    )


def _skip_list(tree: Path, hf, *, is_hybrid: bool, user_skip: list[str] | None = None,
               cache_dtype: str = "turboquant_k8v4") -> list[str]:
    cache_config = SimpleNamespace(kv_cache_dtype_skip_layers=list(user_skip or []))
    model_config = SimpleNamespace(is_hybrid=is_hybrid, hf_text_config=hf, hf_config=hf)
    ns = {"resolved_cache_dtype": cache_dtype, "model_config": model_config, "cache_config": cache_config,
          "logger": logging.getLogger("test.tq_hybrid")}
    exec_block(tree, ARG_UTILS, _turboquant_block(tree), ns)
    return cache_config.kv_cache_dtype_skip_layers


def test_qwen3_next_hybrid_skips_boundary_attention_layers(patched_tree: Path) -> None:
    hf = transformers.Qwen3NextConfig(**QWEN3_NEXT12.config)
    assert _skip_list(patched_tree, hf, is_hybrid=True) == ["1", "3", "9", "11"]


def test_hybrid_user_skip_layers_are_kept(patched_tree: Path) -> None:
    hf = transformers.Qwen3NextConfig(**QWEN3_NEXT12.config)
    assert _skip_list(patched_tree, hf, is_hybrid=True, user_skip=["5", "6"]) == ["1", "3", "5", "6", "9", "11"]


def test_hybrid_without_layer_pattern_is_still_refused(patched_tree: Path) -> None:
    hf = SimpleNamespace(num_hidden_layers=8)
    with pytest.raises(NotImplementedError, match="attention layers"):
        _skip_list(patched_tree, hf, is_hybrid=True)


@pytest.mark.parametrize("num_layers", [1, 2, 3, 4, 5, 6, 12, 32])
def test_uniform_models_unchanged(pristine_tree: Path, patched_tree: Path, num_layers: int) -> None:
    hf = transformers.LlamaConfig(**{**LLAMA6.config, "num_hidden_layers": num_layers})
    got = _skip_list(patched_tree, hf, is_hybrid=False, user_skip=["2"])
    assert got == _skip_list(pristine_tree, hf, is_hybrid=False, user_skip=["2"])
    if num_layers == 6:
        assert got == ["0", "1", "2", "4", "5"]


def test_non_turboquant_dtypes_untouched(patched_tree: Path) -> None:
    hf = transformers.Qwen3NextConfig(**QWEN3_NEXT12.config)
    assert _skip_list(patched_tree, hf, is_hybrid=True, cache_dtype="fp8") == []
