"""Decodes of different lengths over a TurboQuant cache in one multi-query launch (the line's patch 0006).

With speculative decoding a batch's decode rows need not all have 1 + K tokens: an ngram request that found no
match in its context is scheduled one token, a drafter may propose fewer than K, and a prompt's last few tokens
(a short extension) count as a decode too. The multi-query kernel takes K+1 rows per request; when the builder
asks for decodes of one length, everything after the first row of another length goes to the per-request loop,
which reads the cache once per query row and query head.

These tests use only what any vLLM's TurboQuant backend offers (its builder and impl classes, vLLM's
``CommonAttentionMetadata``), with the tree's real kernels (``tq_harness.load_backend``), so they are the
patch's ``Obsolete-If: test`` check on a newer unpatched tree too:

1. A batch of decodes of 4, 1, 4 and 2 tokens (K = 3) gives the causal attention of the device lengths, its
   host-side lengths the optimistic bound of async scheduling.
2. It reads each request's cache about once per KV head, as a uniform verify batch does (counted in Triton's
   interpreter): one pass of the multi-query kernel, not the loop.
3. Where the batch's K+1 rows per request exceed the workspace (max_num_batched_tokens below max_num_seqs times
   K+1), the output is still the causal attention.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import test_tq_verify_route as route
import torch
import tq_harness

import vllm_tree
from references import TQLayout, build_tq_cache, tq_attention_ref

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

K, K1, HK, HQ, D, BLOCK, SCALE = route.K, route.K1, route.HK, route.HQ, route.D, route.BLOCK, route.SCALE
DEVICE, CENTROIDS, _spec, _mismatch = route.DEVICE, route.CENTROIDS, route._spec, route._mismatch
tree, config, tq = route.tree, route.config, route.tq

# Context lengths (the new tokens included, already stored) and tokens scheduled: a full verify row first, then an
# ngram request without a match, another full row and a partial draft.
LENS = [37, 54, 23, 41]
QUERY_LENS = [4, 1, 4, 2]
HOST_EXCESS = [2, 3, 1, 2]


@dataclasses.dataclass
class RaggedBatch:
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    storage: torch.Tensor  # 0.33's (blocks, Hk, block_size, slot)
    block_table: torch.Tensor
    query: torch.Tensor  # (sum(QUERY_LENS), Hq, D), request-major


def _batch(tree: Path, preset: str, seed: int = 0) -> RaggedBatch:
    bits = TQLayout.from_preset(preset, D).centroid_bits
    centroids = vllm_tree.load_module(tree, CENTROIDS).get_centroids(D, bits)
    cache = build_tq_cache(preset, LENS, HK, D, BLOCK, DEVICE, seed=seed, centroids=centroids)
    storage = cache.kv_cache.permute(0, 2, 1, 3).contiguous()
    query = torch.randn(sum(QUERY_LENS), HQ, D, generator=torch.Generator().manual_seed(seed + 1))
    return RaggedBatch(cache.keys, cache.values, storage, cache.block_table, query.to(torch.float16).to(DEVICE))


def _common(tq, batch: RaggedBatch, host_excess):
    cam_cls = tq.CommonAttentionMetadata
    b = len(LENS)
    ql = torch.tensor(QUERY_LENS, dtype=torch.int32)
    qsl = torch.zeros(b + 1, dtype=torch.int32)
    qsl[1:] = ql.cumsum(0)
    seq = torch.tensor(LENS, dtype=torch.int32)
    host = seq + torch.tensor(host_excess, dtype=torch.int32)
    pos = torch.cat([torch.arange(n - q, n) for n, q in zip(LENS, QUERY_LENS, strict=True)]).to(DEVICE)
    req = torch.repeat_interleave(torch.arange(b), ql).to(DEVICE)
    slots = batch.block_table[req, pos // BLOCK].long() * BLOCK + pos % BLOCK
    kw = dict(query_start_loc=qsl.to(DEVICE), query_start_loc_cpu=qsl, seq_lens=seq.to(DEVICE), num_reqs=b,
              num_actual_tokens=int(qsl[-1]), max_query_len=int(ql.max()), max_seq_len=int(host.max()),
              block_table_tensor=batch.block_table, slot_mapping=slots)
    for field in dataclasses.fields(cam_cls):
        if re.match(r"_?seq_lens\w*cpu", field.name) and field.init:
            kw[field.name] = host.clone()
    return cam_cls(**kw)


def _forward(tq, config, preset: str, batch: RaggedBatch, host_excess) -> torch.Tensor:
    backend = tq.TurboQuantAttentionBackend
    builder = backend.get_builder_cls()(_spec(preset), ["model.layers.0.self_attn.attn"], config, DEVICE)
    meta = builder.build(0, _common(tq, batch, host_excess))
    impl = backend.get_impl_cls()(num_heads=HQ, head_size=D, scale=SCALE, num_kv_heads=HK, alibi_slopes=None,
                                  sliding_window=None, kv_cache_dtype=preset)
    n = batch.query.shape[0]
    out = torch.full((n, HQ * D), float("nan"), dtype=torch.float16, device=DEVICE)
    kv = torch.zeros(n, HK, D, dtype=torch.float16, device=DEVICE)
    got = impl.forward(SimpleNamespace(), batch.query, kv, kv, tq_harness.forward_cache(tq, batch.storage), meta,
                       output=out)
    return got.view(n, HQ, D)


def _reference(batch: RaggedBatch) -> torch.Tensor:
    """Token i of request r's q_r sees the first L_r - q_r + 1 + i positions."""
    rows_len = [n - q + 1 + i for n, q in zip(LENS, QUERY_LENS, strict=True) for i in range(q)]
    rows_req = [r for r, q in enumerate(QUERY_LENS) for _ in range(q)]
    return tq_attention_ref(batch.query, batch.keys, batch.values, rows_len, SCALE, rows_request=rows_req)


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_4bit_nc"])
def test_decodes_of_different_lengths_attend_over_the_device_lengths(tq, config, tree, preset):
    batch = _batch(tree, preset)
    wrong = _mismatch(_forward(tq, config, preset, batch, HOST_EXCESS), _reference(batch))
    assert wrong is None, f"{preset}, decodes of {QUERY_LENS} tokens: {wrong}"


def test_decodes_of_different_lengths_read_the_cache_once_per_kv_head(tq, config, tree):
    route.skip_unless_interpreted()
    preset = "turboquant_4bit_nc"
    batch = _batch(tree, preset, seed=3)
    with tq_harness.interpreted_loads(batch.storage) as read:
        out = _forward(tq, config, preset, batch, [0] * len(LENS))
    excess = route.read_excess(read[0], batch.storage, LENS)
    assert excess is None, (f"the batch of decodes of {QUERY_LENS} tokens {excess}: the rows after the first of "
                            f"another length went to the per-request loop, which reads the cache once per query "
                            f"row and query head")
    assert _mismatch(out, _reference(batch)) is None


def test_more_rows_than_the_workspace_still_attend_causally(tq, tree):
    """max_num_batched_tokens = 8 holds two requests of K+1 rows: the builder cannot pad four."""
    preset = "turboquant_k8v4"
    small = tq_harness.vllm_config(K, HQ, splits=2, max_num_batched_tokens=2 * K1)
    batch = _batch(tree, preset, seed=5)
    wrong = _mismatch(_forward(tq, small, preset, batch, HOST_EXCESS), _reference(batch))
    assert wrong is None, f"{preset}, decodes of {QUERY_LENS} tokens, 8 batched tokens at most: {wrong}"
