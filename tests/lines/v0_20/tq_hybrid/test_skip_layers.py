"""TurboQuant boundary protection on hybrid models: the skip list counts attention layers only.

TurboQuant leaves the first and last 2 layers of a model unquantized. On a hybrid model the layers
with a KV cache are the attention layers; the skip list must name the first and last 2 of *those*,
by their global layer index (the index ``Attention`` reads from its prefix). A 12-layer Qwen3-Next
with ``layer_types`` alternating linear/full attention has attention layers 1, 3, 5, 7, 9, 11: the
skip list is 1, 3, 9, 11 and layers 5 and 7 use the TurboQuant cache.

The functions live in ``turboquant/config.py``, a pure-Python file loaded from each tree.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers

from harness.models import QWEN3_NEXT12  # the model of GPU scenario b-tq-hybrid-gdn
from vllm_tree import load_module

pytestmark = pytest.mark.patch("turboquant-on-hybrid-attention-gdn-models")

CONFIG = "vllm/model_executor/layers/quantization/turboquant/config.py"


def _tq(tree: Path):
    return load_module(tree, CONFIG).TurboQuantConfig


def test_qwen3_next_12_attention_layers_and_skip_list(patched_tree: Path) -> None:
    tq = _tq(patched_tree)
    hf = transformers.Qwen3NextConfig(**QWEN3_NEXT12.config)
    attn = tq.get_attention_layer_indices(hf, hf)
    assert attn == [1, 3, 5, 7, 9, 11]
    assert tq.get_boundary_skip_layers(12, attn_layer_indices=attn) == ["1", "3", "9", "11"]
    quantized = sorted(set(attn) - {int(i) for i in tq.get_boundary_skip_layers(12, attn_layer_indices=attn)})
    assert quantized == [5, 7]


def test_default_qwen3_next_pattern(patched_tree: Path) -> None:
    """``full_attention_interval`` 4 (transformers' default): attention at 3, 7, 11, 15, ..."""
    tq = _tq(patched_tree)
    hf = transformers.Qwen3NextConfig(num_hidden_layers=48)
    attn = tq.get_attention_layer_indices(hf)
    assert attn == list(range(3, 48, 4))
    assert tq.get_boundary_skip_layers(48, attn_layer_indices=attn) == ["3", "7", "43", "47"]


@pytest.mark.parametrize(
    ("n_attn", "expected"),
    [(0, []), (1, []), (2, [0, 1]), (3, [0, 2]), (4, [0, 1, 2, 3]), (5, [0, 1, 3, 4]), (6, [0, 1, 4, 5])],
)
def test_few_attention_layers_never_skips_more_than_half(patched_tree: Path, n_attn: int, expected: list[int]) -> None:
    """Same rule as the uniform case (``n = min(2, count // 2)``), applied to the attention layers."""
    tq = _tq(patched_tree)
    attn = [10 * i + 7 for i in range(n_attn)]  # arbitrary global positions
    got = tq.get_boundary_skip_layers(10 * n_attn + 8, attn_layer_indices=attn)
    assert got == [str(attn[i]) for i in expected]


def test_jamba_layers_block_type(patched_tree: Path) -> None:
    tq = _tq(patched_tree)
    hf = transformers.JambaConfig(num_hidden_layers=32)  # attention every 8 layers from offset 4
    attn = tq.get_attention_layer_indices(hf, hf)
    assert attn == [4, 12, 20, 28]
    assert tq.get_boundary_skip_layers(32, attn_layer_indices=attn) == ["4", "12", "20", "28"]


def test_minimax_attn_type_list_and_text_config(patched_tree: Path) -> None:
    tq = _tq(patched_tree)
    minimax = SimpleNamespace(attn_type_list=[0, 0, 1] * 4)
    assert tq.get_attention_layer_indices(minimax, minimax) == [2, 5, 8, 11]
    # Multimodal wrappers (Qwen3.5): the pattern is on the text config.
    text = SimpleNamespace(layer_types=["linear_attention"] * 3 + ["full_attention"])
    assert tq.get_attention_layer_indices(text, SimpleNamespace()) == [3]
    # GraniteMoeHybrid spells it "attention".
    granite = SimpleNamespace(layer_types=["mamba", "attention", "mamba", "mamba"])
    assert tq.get_attention_layer_indices(granite) == [1]


def test_unknown_pattern_gives_none(patched_tree: Path) -> None:
    """No pattern (FalconH1, Plamo2, ...): None, and create_engine_config keeps refusing those models."""
    tq = _tq(patched_tree)
    assert tq.get_attention_layer_indices(SimpleNamespace(num_hidden_layers=8), SimpleNamespace()) is None


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_uniform_skip_list_unchanged(pristine_tree: Path, patched_tree: Path, n: int) -> None:
    """Without attention indices (uniform models) the result is the release's, for every size."""
    old, new = _tq(pristine_tree), _tq(patched_tree)
    for num_layers in range(-1, 70):
        assert new.get_boundary_skip_layers(num_layers, n) == old.get_boundary_skip_layers(num_layers, n)
        assert new.get_boundary_skip_layers(num_layers, n=n) == old.get_boundary_skip_layers(num_layers, n=n)
    assert new.get_boundary_skip_layers(6) == ["0", "1", "4", "5"] == old.get_boundary_skip_layers(6)
