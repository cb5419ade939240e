"""The TurboQuant decode scratch the attention layers allocate at init (patch 0002).

The routed spec-verify path runs the decode kernel on ``1 + num_speculative_tokens`` rows per request
and never grows the buffers (one allocated during CUDA graph capture would come from the graph memory
pool), so they must hold the largest verify batch from the start. v0.20.0 gives every layer its own set
for ``max_num_seqs`` rows, enough for single-token decodes only. Layers run one after another, so the
patched tree allocates one set for all TurboQuant layers of a shape, with rows bounded by
``max_num_batched_tokens`` too: at vLLM's default settings its scratch is smaller than the release's,
so the KV cache keeps its capacity.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_tree import load_function

pytestmark = pytest.mark.patch("turboquant-route-spec-verify-batches-through-decode-kernel")

ATTENTION = "vllm/model_executor/layers/attention/attention.py"
MAX_NUM_SEQS, BATCHED_TOKENS, SPLITS, HEADS, HEAD_DIM = 8, 2048, 32, 4, 128


def config(num_spec: int | None, max_num_seqs: int = MAX_NUM_SEQS, batched_tokens: int = BATCHED_TOKENS,
           splits: int = SPLITS) -> SimpleNamespace:
    spec = None if num_spec is None else SimpleNamespace(num_speculative_tokens=num_spec)
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=batched_tokens),
        speculative_config=spec,
        attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=splits),
    )


def layers(tree, cfg: SimpleNamespace, count: int = 2, heads: int = HEADS) -> list[torch.nn.Module]:
    """``count`` attention layers' TurboQuant buffers as the tree's code allocates them under ``cfg``."""
    names = dict(torch=torch, get_current_vllm_config=lambda: cfg)
    try:
        # The patched module's shared-scratch helper and its cache (one per tree load, like a process).
        names["_TQ_DECODE_SCRATCH"] = {}
        names["_turboquant_decode_scratch"] = load_function(tree, ATTENTION, "_turboquant_decode_scratch",
                                                            **names)
    except LookupError:
        pass  # the release has no such helper
    init = load_function(tree, ATTENTION, "Attention._init_turboquant_buffers", **names)
    out = []
    for i in range(count):
        layer = torch.nn.Module()
        layer.num_heads = heads
        init(layer, "turboquant_k8v4", HEAD_DIM, f"model.layers.{2 + i}.self_attn.attn")
        out.append(layer)
    return out


def buffers(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer._tq_mid_o_buf, layer._tq_output_buf, layer._tq_lse_buf


def rows(layer: torch.nn.Module) -> set[int]:
    return {b.shape[0] for b in buffers(layer)}


def scratch_bytes(model_layers: list[torch.nn.Module]) -> int:
    """Bytes of distinct scratch tensors over the layers (a shared tensor counts once)."""
    seen = {id(b): b for layer in model_layers for b in buffers(layer)}
    return sum(b.numel() * b.element_size() for b in seen.values())


@pytest.mark.parametrize("num_spec", [1, 3, 8])
def test_decode_buffers_hold_every_verify_batch(patched_tree, num_spec):
    layer = layers(patched_tree, config(num_spec), count=1)[0]
    assert rows(layer) == {MAX_NUM_SEQS * (1 + num_spec)}
    assert layer._tq_mid_o_buf.shape[1:] == (HEADS, SPLITS, HEAD_DIM + 1)


def test_verify_rows_are_bounded_by_the_token_budget(patched_tree):
    """No step has more decode-kernel rows than tokens: 1024 requests x 4 rows, 8192 tokens a step."""
    assert rows(layers(patched_tree, config(3, max_num_seqs=1024, batched_tokens=2048), count=1)[0]) == {2048}
    assert rows(layers(patched_tree, config(3, max_num_seqs=1024, batched_tokens=8192), count=1)[0]) == {4096}
    # A token budget below max_num_seqs never shrinks the release's decode rows.
    assert rows(layers(patched_tree, config(None, max_num_seqs=256, batched_tokens=128), count=1)[0]) == {256}


def test_layers_share_one_set(patched_tree):
    first, second, other_shape = (*layers(patched_tree, config(3)),
                                  *layers(patched_tree, config(3), count=1, heads=2 * HEADS))
    for a, b in zip(buffers(first), buffers(second), strict=True):
        assert a is b
    assert all(a is not c for a, c in zip(buffers(first), buffers(other_shape), strict=True))


def test_release_gives_each_layer_its_own_small_set(pristine_tree):
    first, second = layers(pristine_tree, config(3))
    assert rows(first) == {MAX_NUM_SEQS}  # too small for a verify batch of 8 requests x 4 queries
    assert all(a is not b for a, b in zip(buffers(first), buffers(second), strict=True))


@pytest.mark.parametrize("num_spec", [3, 8])
def test_default_settings_scratch_is_no_larger_than_the_releases(patched_tree, pristine_tree, num_spec):
    """vLLM's defaults on a >= 70 GiB GPU (1024 sequences, 8192 batched tokens) for 24 TurboQuant
    layers of 32 heads: the scratch the KV cache competes with, shapes only (meta tensors)."""
    cfg = config(num_spec, max_num_seqs=1024, batched_tokens=8192)
    with torch.device("meta"):
        patched = scratch_bytes(layers(patched_tree, cfg, count=24, heads=32))
        release = scratch_bytes(layers(pristine_tree, cfg, count=24, heads=32))
    assert patched <= release
