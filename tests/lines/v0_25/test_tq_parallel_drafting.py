"""Patch 0003 on 0.25.1: the multi-query scratch covers the widest request the builder takes as a decode.

0.25.1 has no ``max_decode_query_len`` (0.33's ``v1/attention/backend.py`` helper); its
``_init_reorder_batch_threshold`` (``backend.py:634-659``) makes a spec-as-decode builder's threshold
1 + 2K with parallel drafting (1 + K without). The line's ``_max_decode_query_len`` must give the same width,
or a verify batch of parallel drafts would reach the kernel with more rows than the workspace reserved before
the lock (a resize under a captured graph, or a refusal once V1 locks the workspace)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import tq_harness

# On 0.25.1's own files (the sdist, downloaded once): an integration test (tests/conftest.py's REAL_TREES
# names the v0.33 fixtures only).
pytestmark = [pytest.mark.integration, pytest.mark.patch("turboquant-multi-query-verify-kernel")]

HQ, HK, D = 8, 2, 128


@pytest.mark.parametrize("parallel", [False, True])
def test_scratch_rows_cover_the_builders_decode_threshold(v025_tree, monkeypatch, parallel):
    num_spec, max_seqs, max_tokens = 3, 4, 8192
    config = tq_harness.vllm_config(num_spec, HQ, max_seqs, 4, max_tokens)
    config.speculative_config.parallel_drafting = parallel
    tq = tq_harness.load_backend(v025_tree, config)
    reserved = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tq, "is_workspace_manager_initialized", lambda: True)
    monkeypatch.setattr(tq, "current_workspace_manager",
                        lambda: SimpleNamespace(get_simultaneous=lambda *shapes: reserved.append(shapes)))
    # The line's kernel module as a device that takes any tiling (absent from the release: nothing to replace).
    monkeypatch.setattr(tq, "tq_mq_device_limits", lambda device: SimpleNamespace(max_shared=1 << 20),
                        raising=False)
    monkeypatch.setattr(tq, "tq_mq_verify_select",
                        lambda *a, **k: (SimpleNamespace(describe=lambda: "any"), []), raising=False)
    monkeypatch.setattr(tq, "tq_mq_verify_split_rows", lambda num_reqs, k1, *a: num_reqs * k1, raising=False)
    spec = SimpleNamespace(num_kv_heads=HK, head_size=D, block_size=16)
    builder = tq.TurboQuantAttentionBackend.get_builder_cls()(spec, ["l"], config, "cpu")
    widest = 1 + (2 if parallel else 1) * num_spec
    assert builder.reorder_batch_threshold == widest
    # The flat split partials, the rotated queries (rows, heads, D) and, with drafts, the padded rows (0007).
    rotated = [shapes[1][0] for shapes in reserved if len(shapes) in (2, 4) and len(shapes[1][0]) == 3]
    assert rotated and max(r[0] for r in rotated) == max_seqs * widest, reserved
