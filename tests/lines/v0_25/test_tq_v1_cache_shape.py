"""Patch 0005 on 0.25.1: Model Runner V1 shapes a TurboQuant layer's cache with its preset, not ``auto``.

0.25.1's V1 runner picks each attention layer's cache dtype in ``_reshape_kv_cache_tensors``
(``v1/worker/gpu_model_runner.py:7190-7208``): ``auto`` where the layer's spec has no ``KVQuantMode``, which is
meant for layers ``--kv-cache-dtype-skip-layers`` keeps unquantized. 0.25.1 has no TurboQuant mode
(``v1/kv_cache_interface.py:62-75``), so every TurboQuant layer asks its backend for the shape of ``auto`` and
the engine stops at boot (``Unknown TurboQuant cache dtype: 'auto'``). V1 is the hybrids' default runner on 0.25.

The runner's own methods are cut out of the tree's file with ``ast`` (it cannot be imported without vLLM's
compiled parts) and run with a stand-in runner that holds only data: a hybrid's three groups (TurboQuant
attention, a skipped attention layer, a Mamba state), the tree's spec classes and the tree's TurboQuant
backend."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from math import prod
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import tq_harness

import vllm_tree

pytestmark = [pytest.mark.integration, pytest.mark.patch("v1-turboquant-kv-cache-shape-with-its-preset")]

RUNNER = "vllm/v1/worker/gpu_model_runner.py"
ATTN_UTILS = "vllm/v1/worker/gpu/attn_utils.py"
BACKEND = "vllm/v1/attention/backend.py"
PRESET = "turboquant_k8v4"
BLOCKS, BLOCK, HK, D = 6, 16, 2, 128
METHODS = ("_reshape_kv_cache_tensors", "_kv_cache_spec_attn_group_iterator", "_has_mixed_attention_kv_layout",
           "_update_hybrid_attention_mamba_layout")


class _SkippedBackend:
    """A blocks-first unquantized backend for the skipped layer; it records the dtype it is asked for."""

    asked: list[str] = []

    @classmethod
    def get_kv_cache_shape(cls, num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        cls.asked.append(cache_dtype_str)
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order():
        raise NotImplementedError

    @classmethod
    def get_kv_cache_block_dim(cls, *args, **kwargs):
        return 0


def _runner(tree: Path, groups: list[SimpleNamespace], tensors: list) -> object:
    """The tree's V1 runner methods on a runner that holds only what they read."""
    kci = vllm_tree.load_module(tree, "vllm/v1/kv_cache_interface.py")
    torch_utils = vllm_tree.load_module(tree, "vllm/utils/torch_utils.py")
    scope = {**vars(kci), "torch": torch, "prod": prod, "itertools": itertools, "Iterator": Iterator,
             "get_dtype_size": torch_utils.get_dtype_size}
    scope["_reshape_attention_kv_cache"] = tq_harness.tree_class(tree, ATTN_UTILS, "_reshape_attention_kv_cache",
                                                                 **scope)
    methods = {name: tq_harness.tree_class(tree, RUNNER, f"GPUModelRunner.{name}", **scope) for name in METHODS}
    runner = type("Runner", (), methods)()
    runner.attn_groups = [[g] for g in groups]
    runner.runner_only_attn_layers = set()
    runner.cache_config = SimpleNamespace(cache_dtype=PRESET)
    runner.kv_cache_config = kci.KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=[
        kci.KVCacheGroupSpec(layer_names=g.layer_names, kv_cache_spec=g.kv_cache_spec) for g in groups])
    return runner, kci


def test_v1_shapes_turboquant_layers_with_their_preset(v025_tree):
    tq = tq_harness.load_backend(v025_tree)
    # The harness's stand-in base class lacks the base method the hybrid layout step calls: the tree's own.
    block_dim = tq_harness.tree_class(v025_tree, BACKEND, "AttentionBackend.get_kv_cache_block_dim")
    backend = type("TurboQuantAttentionBackend", (tq.TurboQuantAttentionBackend,),
                   {"get_kv_cache_block_dim": block_dim})
    kci = vllm_tree.load_module(v025_tree, "vllm/v1/kv_cache_interface.py")
    slot = backend.get_kv_cache_shape(1, BLOCK, HK, D, cache_dtype_str=PRESET)[-1]
    # The spec as the tree's attention layer gives it: the preset's KVQuantMode (0.25.1: none, hence the `auto`
    # branch; 0.27.0 on: TURBOQUANT, vllm PR #50533).
    tq_spec = kci.TQFullAttentionSpec(block_size=BLOCK, num_kv_heads=HK, head_size=D, head_size_v=D,
                                      dtype=torch.uint8, kv_quant_mode=kci.get_kv_quant_mode(PRESET),
                                      tq_slot_size=slot)
    skipped_spec = kci.FullAttentionSpec(block_size=BLOCK, num_kv_heads=HK, head_size=D, head_size_v=D,
                                         dtype=torch.bfloat16)
    mamba_spec = kci.MambaSpec(block_size=BLOCK, shapes=((3, 64), (4, 16, 16)), dtypes=(torch.bfloat16, torch.float32))
    groups = [SimpleNamespace(kv_cache_group_id=i, backend=b, kv_cache_spec=s, layer_names=[n])
              for i, (n, b, s) in enumerate((("attn.tq", backend, tq_spec), ("attn.skipped", _SkippedBackend,
                                                                              skipped_spec),
                                             ("gdn", None, mamba_spec)))]
    sizes = {g.layer_names[0]: BLOCKS * g.kv_cache_spec.page_size_bytes for g in groups}
    runner, kci = _runner(v025_tree, groups, [kci.KVCacheTensor(size=n, shared_by=[name])
                                             for name, n in sizes.items()])
    raw = {name: torch.zeros(n, dtype=torch.int8) for name, n in sizes.items()}
    _SkippedBackend.asked.clear()

    caches = runner._reshape_kv_cache_tensors(raw, [BLOCK, BLOCK, BLOCK])

    # The preset's shape (0.25's blocks-first layout (blocks, block_size, Hk, slot), 0.27's (blocks, Hk,
    # block_size, slot)): the backend refuses to shape `auto`.
    assert tuple(caches["attn.tq"].shape) == backend.get_kv_cache_shape(BLOCKS, BLOCK, HK, D,
                                                                        cache_dtype_str=PRESET)
    assert caches["attn.tq"].shape[-1] == slot
    assert caches["attn.tq"].dtype == torch.uint8
    # The skipped layer keeps the unquantized shape: the fix is for TurboQuant's spec only.
    assert _SkippedBackend.asked == ["auto"]
    assert tuple(caches["attn.skipped"].shape) == (BLOCKS, 2, BLOCK, HK, D)
    # The Mamba layer keeps its own bytes: its state views (0.25: one per state, (blocks, *shape); 0.27: one int8
    # page view) span exactly its pages of its raw tensor.
    views = caches["gdn"] if isinstance(caches["gdn"], list) else [caches["gdn"]]
    assert all(v.untyped_storage().data_ptr() == raw["gdn"].untyped_storage().data_ptr() for v in views)
    assert sum(v.numel() * v.element_size() for v in views) == sizes["gdn"]
