"""TurboQuant spec-verify routing (patch 0002): uniform K+1 batches as B*(K+1) decode rows, one launch.

The patched ``triton_turboquant_decode.py`` gains three small functions the backend composes:
``tq_spec_verify_query_len`` (the routing predicate, host values only), ``tq_spec_verify_seq_lens``
(row ``r*K1+i`` sees ``L_r-K1+1+i`` tokens, clamped at 0) and ``tq_spec_verify_block_table`` (each
request's block-table row repeated K1 times). The pristine tree has none of them, so every test here
fails on it (run with ``VLLM_PATCH_PATCHED_TREE`` pointing at a pristine tree to see that).

Oracles for the routed call (the launcher fed by those two functions, the layer's decode buffers passed
as the backend passes them):

- v0.20's per-request continuation path, launched from the pristine tree exactly as
  ``_prefill_attention`` does it: per request, ``arange(cached+1, seq+1)`` lengths and
  ``block_table[r:r+1].expand(K1, -1)``. Same kernel, same split count, so the rows are computed by the
  same programs: bitwise equal, except that the MSE presets rotate the query with a GEMM
  (``q.float() @ PiT``) over B*K1 rows instead of K1 rows, whose blocking may round the last float32
  bit differently on a GPU; there the routed result may differ by one output ulp.
- a float64 PyTorch reference over the K/V dequantized from the same cache bytes, causal per row.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from references import build_tq_cache, stage_graph_batch, tq_attention_ref
from vllm_tree import interpreted, load_module

pytestmark = [pytest.mark.kernels, pytest.mark.patch("turboquant-route-spec-verify-batches-through-decode-kernel")]

DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
ROUTE_LIMIT = 128  # the backend's _SPEC_VERIFY_MAX_QUERY_LEN

# Reference tolerance: the kernel dequantizes the same bytes as the reference, accumulates in float32
# (split-KV online softmax) and rounds the output to the query dtype.
REF_TOL = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# One output ulp (see the module docstring): only for the MSE presets, only when not bitwise equal.
ULP_TOL = {torch.float16: dict(atol=1e-3, rtol=2**-10), torch.bfloat16: dict(atol=8e-3, rtol=2**-7)}


@pytest.fixture
def patched_ops(patched_tree):
    return load_module(patched_tree, DECODE)


@pytest.fixture
def pristine_ops(pristine_tree):
    return load_module(pristine_tree, DECODE)


# ---------------------------------------------------------------------------
# Pure pieces (CPU)
# ---------------------------------------------------------------------------


def _route(ops, **overrides) -> int:
    """The predicate for a uniform batch of 3 requests x K1=4 under spec decode with 3 drafts, unless overridden."""
    args = dict(is_prefill=True, num_decodes=0, max_query_len=4, num_tokens=12, num_reqs=3, graph_query_len=4,
                max_spec_query_len=ROUTE_LIMIT)
    args.update(overrides)
    return ops.tq_spec_verify_query_len(**args)


def test_predicate_routes_uniform_verify_batches(patched_ops):
    # The verify shape is routed whatever the lengths are: the FULL-graph capture batch and the eager warm-up
    # before it (seq_lens == K1 there) must take the path the graph will replay.
    assert _route(patched_ops) == 4
    # A padded FULL-graph batch: 3 real requests padded to 16 tokens = 4 requests (the last one empty).
    assert _route(patched_ops, num_tokens=16, num_reqs=4) == 4
    # K1 = 2 (one draft) and the largest routed length.
    assert _route(patched_ops, max_query_len=2, num_tokens=6, graph_query_len=2) == 2
    assert _route(patched_ops, max_query_len=ROUTE_LIMIT, num_tokens=3 * ROUTE_LIMIT,
                  graph_query_len=ROUTE_LIMIT) == ROUTE_LIMIT


@pytest.mark.parametrize("overrides", [
    pytest.param(dict(is_prefill=False, max_query_len=1, num_tokens=3), id="pure-decode-batch"),
    pytest.param(dict(num_decodes=1), id="mixed-batch-with-q1-decodes"),
    pytest.param(dict(max_query_len=1, num_tokens=3, graph_query_len=None), id="K1=1"),
    pytest.param(dict(max_query_len=ROUTE_LIMIT + 1, num_tokens=3 * (ROUTE_LIMIT + 1),
                      graph_query_len=ROUTE_LIMIT + 1), id="K1-over-limit"),
    # Uniform batches of another length (equal continuation chunks, fewer drafts for every request) and
    # uniform batches without spec decode keep the per-request path and its per-request temporaries.
    pytest.param(dict(max_query_len=3, num_tokens=9), id="not-verify-length"),
    pytest.param(dict(graph_query_len=None), id="no-spec-decode"),
    pytest.param(dict(num_tokens=10), id="query-lengths-differ"),
    pytest.param(dict(num_tokens=12, num_reqs=4), id="more-requests-than-K1-groups"),
    pytest.param(dict(num_tokens=12, num_reqs=2), id="fewer-requests-than-K1-groups"),
    pytest.param(dict(num_tokens=0, num_reqs=0), id="empty-batch"),
])
def test_predicate_rejects(patched_ops, overrides):
    assert _route(patched_ops, **overrides) == 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_synthetic_seq_lens(patched_ops, dtype):
    k1 = 4
    # A persistent buffer longer than the batch (vLLM passes seq_lens[:num_reqs_padded] views of one).
    seq_lens = torch.tensor([10, 5, 37, 999], dtype=dtype)
    got = patched_ops.tq_spec_verify_seq_lens(seq_lens, 3, k1)
    assert got.dtype == dtype and got.shape == (12,)
    assert got.tolist() == [7, 8, 9, 10, 2, 3, 4, 5, 34, 35, 36, 37]
    # Row r*K1+i sees L_r-K1+1+i tokens: the per-request path's arange(cached+1, seq+1).
    want = torch.cat([torch.arange(L - k1 + 1, L + 1) for L in (10, 5, 37)]).to(dtype)
    assert torch.equal(got, want)
    assert seq_lens.tolist() == [10, 5, 37, 999]  # input untouched


def test_synthetic_seq_lens_padding_and_capture(patched_ops):
    k1 = 4
    # Padding requests of a FULL-graph batch have seq_len 0: all their rows clamp to 0 (no cache read).
    got = patched_ops.tq_spec_verify_seq_lens(torch.tensor([6, 0], dtype=torch.int32), 2, k1)
    assert got.tolist() == [3, 4, 5, 6, 0, 0, 0, 0]
    # build_for_cudagraph_capture fills seq_lens with 1: lengths 2-K1..1 clamp to 0,..,0,1.
    got = patched_ops.tq_spec_verify_seq_lens(torch.ones(3, dtype=torch.int32), 3, k1)
    assert got.tolist() == [0, 0, 0, 1] * 3
    # A request with one cached token (L = K1 + 1): every row sees at least 2 tokens.
    got = patched_ops.tq_spec_verify_seq_lens(torch.tensor([k1 + 1], dtype=torch.int32), 1, k1)
    assert got.tolist() == [2, 3, 4, 5]
    assert int(got.min()) >= 0


def test_repeated_block_table(patched_ops):
    bt = torch.arange(4 * 5, dtype=torch.int32).view(4, 5)
    got = patched_ops.tq_spec_verify_block_table(bt, 3, 2)
    assert got.dtype == torch.int32 and got.shape == (6, 5) and got.is_contiguous()
    assert torch.equal(got, bt[[0, 0, 1, 1, 2, 2]])
    # The launcher reads rows through stride(0): a real copy, not an expanded view.
    assert got.stride() == (5, 1)


def test_pristine_has_no_routing(pristine_ops):
    """What the tests above need is new in the series."""
    for name in ("tq_spec_verify_query_len", "tq_spec_verify_seq_lens", "tq_spec_verify_block_table"):
        assert not hasattr(pristine_ops, name)


# ---------------------------------------------------------------------------
# The routed call against v0.20's per-request path and the reference
# ---------------------------------------------------------------------------

PRESETS = ["k8v4", "4bit_nc", "3bit_nc"]


def _cuda_matrix():
    for k1, group, bs, d, dtype, preset in itertools.product(
            [2, 4, 6], [1, 2, 6, 8], [16, 32], [128, 256], [torch.bfloat16, torch.float16], PRESETS):
        yield pytest.param(k1, group, bs, d, dtype, preset,
                           id=f"K1={k1}-gqa{group}-bs{bs}-d{d}-{str(dtype)[6:]}-{preset}")


# The CPU interpreter runs each kernel program in Python: a few representative cases (bfloat16 queries only
# with MSE keys, where the kernel sees the float32 rotated query; the interpreter mis-handles bfloat16).
CPU_CASES = [
    pytest.param(4, 2, 16, 128, torch.float16, "k8v4", id="K1=4-gqa2-bs16-d128-fp16-k8v4"),
    pytest.param(2, 1, 32, 128, torch.bfloat16, "4bit_nc", id="K1=2-gqa1-bs32-d128-bf16-4bit_nc"),
    pytest.param(6, 2, 16, 128, torch.float16, "3bit_nc", id="K1=6-gqa2-bs16-d128-fp16-3bit_nc"),
]


def _matrix():
    return list(_cuda_matrix()) if torch.cuda.is_available() else CPU_CASES


class _Layer:
    """Holds the decode buffers as the attention layer does (``buf_holder``)."""


def _routed(ops, query, cache, seq_lens, k1, scale, splits, holder):
    """The backend's routed call: synthetic lengths, repeated block table, the layer's buffers."""
    n = query.shape[0]
    num_reqs = n // k1
    bt = ops.tq_spec_verify_block_table(cache.block_table, num_reqs, k1)
    sl = ops.tq_spec_verify_seq_lens(seq_lens, num_reqs, k1)
    return ops.triton_turboquant_decode_attention(
        query, cache.kv_cache, bt, sl, scale=scale, **cache.decode_kwargs,
        mid_o_buf=getattr(holder, "_tq_mid_o_buf", None), output_buf=getattr(holder, "_tq_output_buf", None),
        lse_buf=getattr(holder, "_tq_lse_buf", None), buf_holder=holder, max_num_kv_splits=splits)


def _per_request(ops, query, cache, lens, k1, scale, splits):
    """v0.20's continuation fast path of _prefill_attention, request by request."""
    outs = []
    for r, seq_len in enumerate(lens):
        cached_len = seq_len - k1
        synth = torch.arange(cached_len + 1, seq_len + 1, device=query.device, dtype=cache.seq_lens.dtype)
        bt = cache.block_table[r: r + 1].expand(k1, -1)
        outs.append(ops.triton_turboquant_decode_attention(
            query[r * k1: (r + 1) * k1], cache.kv_cache, bt, synth, scale=scale, **cache.decode_kwargs,
            max_num_kv_splits=splits))
    return torch.cat(outs)


def _reference(query, cache, lens, k1, scale):
    rows_len = [L - k1 + 1 + i for L in lens for i in range(k1)]
    rows_req = [r for r in range(len(lens)) for _ in range(k1)]
    return tq_attention_ref(query, cache.keys, cache.values, rows_len, scale, rows_request=rows_req)


def _assert_same_as_per_request(routed, per_req, preset, dtype):
    if torch.equal(routed, per_req):
        return
    assert preset != "k8v4", "FP8 keys: no GEMM before the kernel, the routed rows must be bitwise equal"
    torch.testing.assert_close(routed.float(), per_req.float(), **ULP_TOL[dtype])


@pytest.mark.parametrize(("k1", "group", "block_size", "head_dim", "dtype", "preset"), _matrix())
def test_routed_matches_per_request_and_reference(patched_ops, pristine_ops, device, k1, group, block_size,
                                                  head_dim, dtype, preset):
    cuda = device == "cuda"
    num_kv_heads = 2 if cuda else 1
    hq = num_kv_heads * group
    # Context lengths: one cached token only, block-boundary crossings, and (on GPU) contexts long enough
    # that every one of the 32 splits has work.
    lens = [k1 + 1, block_size + 3, 2 * block_size + k1, 9 * block_size + 5, 300] if cuda else \
        [k1 + 1, block_size + 3, 2 * block_size - 1]
    splits = 32 if cuda else 4
    seed = ((k1 * 10 + group) * 100 + block_size) * 1000 + head_dim + PRESETS.index(preset)
    gen = torch.Generator().manual_seed(seed)
    cache = build_tq_cache(preset, lens, num_kv_heads, head_dim, block_size, device, dtype=dtype, seed=seed)
    n = len(lens) * k1
    query = torch.randn(n, hq, head_dim, generator=gen).to(device=device, dtype=dtype)
    scale = 1.0 / math.sqrt(head_dim)

    # The layer's buffers, allocated larger than this batch (as after a bigger capture): the launcher
    # must use slices of them and allocate none.
    holder = _Layer()
    holder._tq_mid_o_buf = torch.full((n + 5, hq, splits, head_dim + 1), float("nan"), device=device)
    holder._tq_output_buf = torch.full((n + 5, hq, head_dim), float("nan"), device=device)
    holder._tq_lse_buf = torch.full((n + 5, hq), float("nan"), device=device)
    buffers = (holder._tq_mid_o_buf, holder._tq_output_buf, holder._tq_lse_buf)

    routed = _routed(patched_ops, query, cache, cache.seq_lens, k1, scale, splits, holder)
    assert routed.shape == (n, hq, head_dim) and routed.dtype == dtype
    assert (holder._tq_mid_o_buf, holder._tq_output_buf, holder._tq_lse_buf) == buffers, "buffers were replaced"

    per_req = _per_request(pristine_ops, query, cache, lens, k1, scale, splits)
    _assert_same_as_per_request(routed, per_req, preset, dtype)

    want = _reference(query, cache, lens, k1, scale)
    torch.testing.assert_close(routed.float(), want, **REF_TOL[dtype])


@pytest.mark.parametrize("preset", ["4bit_nc"] if interpreted() else PRESETS)
def test_padding_and_capture_rows(patched_ops, device, preset):
    """Rows of padding requests (seq_len 0) and of the capture batch (seq_len 1) never disturb real rows."""
    k1, bs, d, nkv, group = 4, 16, 128, 1, 2
    hq = nkv * group
    lens = [k1 + 3, 21]
    splits = 32 if device == "cuda" else 4
    cache = build_tq_cache(preset, lens, nkv, d, bs, device, seed=7)
    gen = torch.Generator().manual_seed(7)
    scale = 1.0 / math.sqrt(d)
    query = torch.randn((len(lens) + 1) * k1, hq, d, generator=gen).to(device=device, dtype=torch.float16)

    alone = _routed(patched_ops, query[: len(lens) * k1], cache, cache.seq_lens, k1, scale, splits, None)

    # A FULL-graph batch padded with one request: seq_len 0, block table row all NULL_BLOCK_ID (0).
    seq_lens = torch.cat([cache.seq_lens, torch.zeros(1, dtype=torch.int32, device=device)])
    table = torch.cat([cache.block_table, torch.zeros_like(cache.block_table[:1])])
    padded_cache = type(cache)(**{**cache.__dict__, "block_table": table, "seq_lens": seq_lens})
    padded = _routed(patched_ops, query, padded_cache, seq_lens, k1, scale, splits, None)
    # (Bitwise, up to the query-rotation GEMM over 12 rows instead of 8: see the module docstring.)
    _assert_same_as_per_request(padded[: len(lens) * k1], alone, preset, torch.float16)

    # The capture batch: seq_lens filled with 1. Each request's last row sees its first token only.
    ones = torch.ones(len(lens), dtype=torch.int32, device=device)
    captured = _routed(patched_ops, query[: len(lens) * k1], cache, ones, k1, scale, splits, None)
    last = captured[k1 - 1:: k1]
    want = tq_attention_ref(query[k1 - 1:: k1][: len(lens)], cache.keys, cache.values, [1] * len(lens), scale)
    torch.testing.assert_close(last.float(), want, **REF_TOL[torch.float16])


# ---------------------------------------------------------------------------
# CUDA graph: capture once (seq_lens = 1, as vLLM captures), replay with new batches
# ---------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU; runs on the GPU host "
                    "(gpu/host.sh kernels)")
@pytest.mark.parametrize("preset", PRESETS)
def test_routed_call_in_cuda_graph(patched_ops, pristine_ops, preset):
    device = "cuda"
    k1, bs, d, nkv, group, splits = 4, 16, 128, 2, 4, 32
    hq = nkv * group
    max_reqs, max_blocks = 6, 24
    n = max_reqs * k1
    scale = 1.0 / math.sqrt(d)
    # Two batches over one paged cache pool: different lengths, tables and request counts (the second is
    # padded with empty requests, as a FULL graph of max_reqs requests replays a smaller batch).
    batches = [[k1 + 1, 40, 77, 130, 5 * bs, 300], [250, 17, k1 + 2]]
    caches = [build_tq_cache(preset, lens, nkv, d, bs, device, seed=11 + i) for i, lens in enumerate(batches)]

    # Persistent inputs (vLLM's seq_lens / block table / query buffers) and the layer's decode buffers.
    q_buf = torch.zeros(n, hq, d, device=device, dtype=torch.float16)
    seq_buf = torch.ones(max_reqs, dtype=torch.int32, device=device)  # build_for_cudagraph_capture
    bt_buf = torch.zeros(max_reqs, max_blocks, dtype=torch.int32, device=device)
    kv_buf = torch.zeros(max(c.kv_cache.shape[0] for c in caches), *caches[0].kv_cache.shape[1:],
                         dtype=torch.uint8, device=device)
    holder = _Layer()
    holder._tq_mid_o_buf = torch.empty(n, hq, splits, d + 1, device=device)
    holder._tq_output_buf = torch.empty(n, hq, d, device=device)
    holder._tq_lse_buf = torch.empty(n, hq, device=device)

    def routed():
        bt = patched_ops.tq_spec_verify_block_table(bt_buf, max_reqs, k1)
        sl = patched_ops.tq_spec_verify_seq_lens(seq_buf, max_reqs, k1)
        return patched_ops.triton_turboquant_decode_attention(
            q_buf, kv_buf, bt, sl, scale=scale, **caches[0].decode_kwargs, mid_o_buf=holder._tq_mid_o_buf,
            output_buf=holder._tq_output_buf, lse_buf=holder._tq_lse_buf, buf_holder=holder,
            max_num_kv_splits=splits)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        routed()  # compile the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = routed()  # no host sync may happen here: capture would fail

    gen = torch.Generator().manual_seed(3)
    for lens, cache in zip(batches, caches, strict=True):
        b = len(lens)
        query = torch.randn(b * k1, hq, d, generator=gen).to(device=device, dtype=torch.float16)
        stage_graph_batch(cache, query, q_buf, seq_buf, bt_buf, kv_buf)
        graph.replay()
        torch.cuda.synchronize()
        got = out[: b * k1]
        eager_cache = type(cache)(**{**cache.__dict__, "kv_cache": kv_buf})
        per_req = _per_request(pristine_ops, query, eager_cache, lens, k1, scale, splits)
        _assert_same_as_per_request(got, per_req, preset, torch.float16)
        torch.testing.assert_close(got.float(), _reference(query, cache, lens, k1, scale), **REF_TOL[torch.float16])
