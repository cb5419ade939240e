"""Decodes of different lengths over a TurboQuant cache in one multi-query launch (the line's patch 0006).

With speculative decoding a batch's decode rows need not all have 1 + K tokens: an ngram request that found no
match in its context is scheduled one token, a drafter may propose fewer than K, and a prompt's last few tokens
(a short extension) count as a decode too. The multi-query kernel takes K+1 rows per request; when the builder
asks for decodes of one length, everything after the first row of another length goes to the per-request loop,
which reads the cache once per query row and query head.

These tests use only what any vLLM's TurboQuant backend offers (its builder and impl classes, vLLM's
``CommonAttentionMetadata``), with the tree's real kernels (``tq_harness.load_backend``), so they are the
patch's ``Obsolete-If: test`` check on a newer unpatched tree too. Launches are the Triton launches handed the
cache (``tq_harness.cache_launches``: compiled or interpreted), so they count on a GPU host as on CPU.

1. A batch of decodes of 4, 1, 4 and 2 tokens (K = 3), its host-side lengths the optimistic bound of async
   scheduling, is served by one launch over the cache, the same launch (kernel and grid) as a uniform verify
   batch of K+1 tokens for the same requests, and gives the causal attention of the device lengths. Without the
   patch the first request takes the kernel and each of the other three a launch of the per-request loop.
2. It reads each request's cache about once per KV head, as a uniform verify batch does: counted in Triton's
   interpreter on CPU; on a GPU host, where no load can be counted, its cache-reading launches are those of the
   uniform verify batch, whose reads the interpreter counts on CPU (test_tq_verify_route.py).
3. The one launch is bounded by the workspace the builder reserves (max_num_seqs x K+1 rows, at most
   max_num_batched_tokens): with room for the batch's four requests of K+1 rows it is one launch, with less the
   output is still the causal attention.
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

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"),
    pytest.mark.patch("turboquant-mixed-length-decodes-in-one-launch"),
]

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


def _common(tq, batch: RaggedBatch, host_excess, query_lens=QUERY_LENS):
    cam_cls = tq.CommonAttentionMetadata
    b = len(LENS)
    ql = torch.tensor(query_lens, dtype=torch.int32)
    qsl = torch.zeros(b + 1, dtype=torch.int32)
    qsl[1:] = ql.cumsum(0)
    seq = torch.tensor(LENS, dtype=torch.int32)
    host = seq + torch.tensor(host_excess, dtype=torch.int32)
    pos = torch.cat([torch.arange(n - q, n) for n, q in zip(LENS, query_lens, strict=True)]).to(DEVICE)
    req = torch.repeat_interleave(torch.arange(b), ql).to(DEVICE)
    slots = batch.block_table[req, pos // BLOCK].long() * BLOCK + pos % BLOCK
    kw = dict(query_start_loc=qsl.to(DEVICE), query_start_loc_cpu=qsl, seq_lens=seq.to(DEVICE), num_reqs=b,
              num_actual_tokens=int(qsl[-1]), max_query_len=int(ql.max()), max_seq_len=int(host.max()),
              block_table_tensor=batch.block_table, slot_mapping=slots)
    for field in dataclasses.fields(cam_cls):
        if re.match(r"_?seq_lens\w*cpu", field.name) and field.init:
            kw[field.name] = host.clone()
    return cam_cls(**kw)


def _forward(tq, config, preset: str, batch: RaggedBatch, host_excess, query_lens=QUERY_LENS,
             query: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
    """(the impl's output, the Triton launches of its forward handed the cache) for the batch with
    ``query_lens`` tokens per request (``query``: their queries, default the batch's)."""
    query = batch.query if query is None else query
    backend = tq.TurboQuantAttentionBackend
    builder = backend.get_builder_cls()(_spec(preset), ["model.layers.0.self_attn.attn"], config, DEVICE)
    meta = builder.build(0, _common(tq, batch, host_excess, query_lens))
    impl = backend.get_impl_cls()(num_heads=HQ, head_size=D, scale=SCALE, num_kv_heads=HK, alibi_slopes=None,
                                  sliding_window=None, kv_cache_dtype=preset)
    n = query.shape[0]
    out = torch.full((n, HQ * D), float("nan"), dtype=torch.float16, device=DEVICE)
    kv = torch.zeros(n, HK, D, dtype=torch.float16, device=DEVICE)
    with tq_harness.cache_launches(batch.storage) as launches:
        got = impl.forward(SimpleNamespace(), query, kv, kv, tq_harness.forward_cache(tq, batch.storage), meta,
                           output=out)
    return got.view(n, HQ, D), launches


def _uniform_launches(tq, config, preset: str, batch: RaggedBatch) -> list:
    """The cache-reading launches of a uniform verify batch of K+1 tokens for each of the batch's requests."""
    query = torch.randn(len(LENS) * K1, HQ, D, generator=torch.Generator().manual_seed(9)).to(torch.float16)
    _, launches = _forward(tq, config, preset, batch, [0] * len(LENS), [K1] * len(LENS), query.to(DEVICE))
    assert len(launches) == 1, f"a uniform verify batch takes {len(launches)} launches over the cache: {launches}"
    return launches


def _reference(batch: RaggedBatch) -> torch.Tensor:
    """Token i of request r's q_r sees the first L_r - q_r + 1 + i positions."""
    rows_len = [n - q + 1 + i for n, q in zip(LENS, QUERY_LENS, strict=True) for i in range(q)]
    rows_req = [r for r, q in enumerate(QUERY_LENS) for _ in range(q)]
    return tq_attention_ref(batch.query, batch.keys, batch.values, rows_len, SCALE, rows_request=rows_req)


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_4bit_nc"])
def test_decodes_of_different_lengths_in_one_launch_over_the_device_lengths(tq, config, tree, preset):
    batch = _batch(tree, preset)
    out, launches = _forward(tq, config, preset, batch, HOST_EXCESS)
    problems = []
    uniform = _uniform_launches(tq, config, preset, batch)
    if launches != uniform:
        problems.append(f"{len(launches)} launches over the cache ({launches}), not the one launch of a uniform "
                        f"verify batch of the same requests ({uniform})")
    wrong = _mismatch(out, _reference(batch))
    if wrong:
        problems.append(f"host-side lengths {HOST_EXCESS} tokens over the device ones: {wrong}")
    assert not problems, f"{preset}, decodes of {QUERY_LENS} tokens: " + "; ".join(problems)


def test_decodes_of_different_lengths_read_the_cache_once_per_kv_head(tq, config, tree):
    preset = "turboquant_4bit_nc"
    batch = _batch(tree, preset, seed=3)
    if vllm_tree.interpreted() and DEVICE == "cpu":
        with tq_harness.interpreted_loads(batch.storage) as read:
            out, _ = _forward(tq, config, preset, batch, [0] * len(LENS))
        excess = route.read_excess(read[0], batch.storage, LENS)
        assert excess is None, (f"the batch of decodes of {QUERY_LENS} tokens {excess}: the rows after the first "
                                f"of another length went to the per-request loop, which reads the cache once per "
                                f"query row and query head")
    else:
        # No load is counted on a GPU: the batch must read the cache through the launch a uniform verify batch
        # of the same requests takes, which reads each request's cache once per KV head.
        out, launches = _forward(tq, config, preset, batch, [0] * len(LENS))
        uniform = _uniform_launches(tq, config, preset, batch)
        assert launches == uniform, (
            f"the batch of decodes of {QUERY_LENS} tokens reads the cache in {len(launches)} launches "
            f"({launches}), not the one launch of a uniform verify batch of its requests ({uniform}), which reads "
            f"each request's cache once per KV head: the rows after the first of another length went to the "
            f"per-request loop, which reads the cache once per query row and query head")
    assert _mismatch(out, _reference(batch)) is None


def test_the_workspace_bounds_the_one_launch(tq, tree):
    """max_num_batched_tokens = 16 holds the four requests' K+1 rows: one launch; 12 does not, and the builder
    cannot pad the batch into it: still the causal attention."""
    preset = "turboquant_k8v4"
    batch = _batch(tree, preset, seed=5)
    want = _reference(batch)
    problems = []
    for max_tokens in (len(LENS) * K1, len(LENS) * K1 - 4):
        small = tq_harness.vllm_config(K, HQ, splits=2, max_num_batched_tokens=max_tokens)
        out, launches = _forward(tq, small, preset, batch, HOST_EXCESS)
        wrong = _mismatch(out, want)
        if wrong:
            problems.append(f"{max_tokens} batched tokens at most: {wrong}")
        if max_tokens >= len(LENS) * K1 and len(launches) != 1:
            problems.append(f"room for {max_tokens} rows: {len(launches)} launches over the cache ({launches}), "
                            f"not one")
    assert not problems, f"{preset}, decodes of {QUERY_LENS} tokens: " + "; ".join(problems)
