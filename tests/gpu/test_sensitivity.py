"""harness.sensitivity on a tiny model: no noise moves nothing, noise the size of the signal moves the choices."""

from __future__ import annotations

import pytest

from harness import models, sensitivity

TINY = models.ModelSpec(name="tiny-sens", arch="llama", seed=5, std=0.05, config=dict(
    vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False))


def test_misses_grow_with_the_noise_and_vanish_without_it():
    pytest.importorskip("transformers")
    r = sensitivity.measure(TINY, tokens=6, eps_values=[0.0, 3.0])
    assert len(r["distinct"]) == 4 and r["margin"] > 0
    assert r["eps"][0.0] == (0.0, 0.0)
    miss, changed = r["eps"][3.0]
    assert miss > 0 and changed > 0
