"""The TurboQuant decode buffers an attention layer allocates at init (patch 0002).

``Attention._init_turboquant_buffers`` pre-allocates the decode kernel's intermediates. The routed
spec-verify path runs the kernel on ``1 + num_speculative_tokens`` rows per request and never grows the
buffers (one allocated during CUDA graph capture would come from the graph memory pool), so they must hold
``max_num_seqs * (1 + num_speculative_tokens)`` rows from the start. v0.20.0 sizes them for
``max_num_seqs`` rows, which is enough for single-token decodes only.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_tree import load_function

ATTENTION = "vllm/model_executor/layers/attention/attention.py"
MAX_NUM_SEQS, SPLITS, HEADS, HEAD_DIM = 8, 32, 4, 128


def init_buffers(tree, num_spec: int | None) -> torch.nn.Module:
    """An attention layer's TurboQuant buffers as the tree's code allocates them under this config."""
    spec = None if num_spec is None else SimpleNamespace(num_speculative_tokens=num_spec)
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_NUM_SEQS),
        speculative_config=spec,
        attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=SPLITS),
    )
    init = load_function(tree, ATTENTION, "Attention._init_turboquant_buffers", torch=torch,
                         get_current_vllm_config=lambda: config)
    layer = torch.nn.Module()
    layer.num_heads = HEADS
    init(layer, "turboquant_k8v4", HEAD_DIM, "model.layers.2.self_attn.attn")
    return layer


def rows(layer: torch.nn.Module) -> set[int]:
    return {layer._tq_mid_o_buf.shape[0], layer._tq_output_buf.shape[0], layer._tq_lse_buf.shape[0]}


@pytest.mark.parametrize("num_spec", [1, 3, 8])
def test_decode_buffers_hold_every_verify_batch(patched_tree, num_spec):
    layer = init_buffers(patched_tree, num_spec)
    assert rows(layer) == {MAX_NUM_SEQS * (1 + num_spec)}
    assert layer._tq_mid_o_buf.shape[1:] == (HEADS, SPLITS, HEAD_DIM + 1)


@pytest.mark.parametrize("num_spec", [None, 0])
def test_without_speculation_the_buffers_are_the_releases(patched_tree, pristine_tree, num_spec):
    assert rows(init_buffers(patched_tree, num_spec)) == rows(init_buffers(pristine_tree, num_spec)) == {MAX_NUM_SEQS}


def test_release_buffers_are_too_small_for_verify_batches(pristine_tree):
    assert rows(init_buffers(pristine_tree, 3)) == {MAX_NUM_SEQS}
