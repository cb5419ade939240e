"""The TurboQuant backend's ``forward`` and metadata builder, run from each tree (see ``tq_backend``).

Batches are built as vLLM hands them to attention: the paged cache already holds every token of each
request, the new ones included (``do_kv_cache_update`` runs first), decodes first. ``seq_lens``,
``query_start_loc`` and the block table are ``DeviceTensor``s: a host read of them inside
``no_host_reads()`` fails the test (on a GPU it would be a sync, fatal under CUDA graph capture).

Expected results: per row, softmax attention over the request's first ``L - q + 1 + t`` positions (row t
of a request with q new tokens and L tokens in all), on the K/V dequantized from the cache for rows the
decode kernel serves and on the raw K/V for fresh prompts (flash-attn or SDPA on the batch's own K/V).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from references import build_tq_cache, tq_attention_ref
from tq_backend import (
    SETTINGS,
    CommonAttentionMetadata,
    CUDAGraphMode,
    HostSync,
    instrument,
    load_backend,
    no_host_reads,
    on_device,
)

# Real trees, fetched by name at run time (unseen by tests/conftest.py's collection hook).
pytestmark = [pytest.mark.kernels, pytest.mark.integration, pytest.mark.patch(
    "turboquant-capture-safe-continuation-prefill",
    "turboquant-route-spec-verify-batches-through-decode-kernel",
    "turboquant-multi-query-verify-kernel",
)]

CUDA = torch.cuda.is_available()
HEAD_DIM = 128 if CUDA else 64
SPLITS = 32 if CUDA else 4
TOL = dict(atol=5e-3, rtol=1e-2)  # float16 queries and outputs
ULP = dict(atol=1e-3, rtol=2**-10)


@pytest.fixture(autouse=True)
def _settings():
    SETTINGS.__init__()
    SETTINGS.kv_splits = SPLITS
    SETTINGS.num_speculative_tokens = 2  # spec decode with K=2: VERIFY batches (K+1 = 3) are the verify shape
    yield
    SETTINGS.__init__()


@dataclass
class Batch:
    q_lens: list[int]
    seq_lens: list[int]
    cache: object
    query: torch.Tensor  # (N, Hq*D)
    key: torch.Tensor  # (N, Hk*D): the new tokens, as stored
    value: torch.Tensor
    num_heads: int
    num_kv_heads: int

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    def common(self, device, *, mirror: bool = True) -> CommonAttentionMetadata:
        qsl = torch.tensor([0, *torch.tensor(self.q_lens).cumsum(0).tolist()], dtype=torch.int32)
        seq = torch.tensor(self.seq_lens, dtype=torch.int32)
        slots = torch.cat([self.cache.slot_mapping[sum(self.seq_lens[:r]) + L - q: sum(self.seq_lens[:r]) + L]
                           for r, (q, L) in enumerate(zip(self.q_lens, self.seq_lens, strict=True))])
        return CommonAttentionMetadata(
            query_start_loc=on_device(qsl.to(device)), query_start_loc_cpu=qsl,
            seq_lens=on_device(seq.to(device)), num_reqs=len(self.q_lens), num_actual_tokens=self.num_tokens,
            max_query_len=max(self.q_lens), max_seq_len=max(self.seq_lens),
            block_table_tensor=on_device(self.cache.block_table), slot_mapping=on_device(slots),
            seq_lens_cpu_upper_bound=seq.clone() if mirror else None)

    def reference(self, scale: float, *, routed: bool = False) -> torch.Tensor:
        """Expected (N, Hq, D): raw K/V for fresh prompts (q == L) unless the batch is routed through the
        decode kernel, dequantized cache K/V otherwise."""
        keys = [raw if q == L and not routed else deq for raw, deq, q, L in
                zip(self.cache.raw_keys, self.cache.keys, self.q_lens, self.seq_lens, strict=True)]
        values = [raw if q == L and not routed else deq for raw, deq, q, L in
                  zip(self.cache.raw_values, self.cache.values, self.q_lens, self.seq_lens, strict=True)]
        rows_len = [L - q + 1 + t for q, L in zip(self.q_lens, self.seq_lens, strict=True) for t in range(q)]
        rows_req = [r for r, q in enumerate(self.q_lens) for _ in range(q)]
        q = self.query.view(self.num_tokens, self.num_heads, -1)
        return tq_attention_ref(q, [k.float() for k in keys], [v.float() for v in values], rows_len, scale,
                                rows_request=rows_req)


def make_batch(preset, q_lens, seq_lens, device, *, group=2, nkv=1, bs=16, seed=0) -> Batch:
    cache = build_tq_cache(preset, seq_lens, nkv, HEAD_DIM, bs, device, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    n, hq = sum(q_lens), nkv * group
    query = torch.randn(n, hq * HEAD_DIM, generator=gen).to(device=device, dtype=torch.float16)
    key = torch.cat([k[L - q:] for k, q, L in zip(cache.raw_keys, q_lens, seq_lens, strict=True)]).flatten(1)
    value = torch.cat([v[L - q:] for v, q, L in zip(cache.raw_values, q_lens, seq_lens, strict=True)]).flatten(1)
    return Batch(list(q_lens), list(seq_lens), cache, query, key, value, hq, nkv)


def run_forward(module, batch: Batch, device, preset, *, metadata=None, layer=None, out_rows=None):
    """impl.forward as unified_attention_with_output calls it: the result must land in ``output``."""
    impl = module.TurboQuantAttentionImpl(num_heads=batch.num_heads, head_size=HEAD_DIM,
                                          scale=1.0 / math.sqrt(HEAD_DIM), num_kv_heads=batch.num_kv_heads,
                                          kv_cache_dtype=f"turboquant_{preset}")
    assert impl.tq_config.slot_size_aligned == batch.cache.layout.slot_size_aligned
    if metadata is None:
        builder = module.TurboQuantMetadataBuilder(None, [], SETTINGS.vllm_config(), device)
        metadata = builder.build(0, batch.common(device))
    layer = layer or SimpleNamespace(_tq_centroids=batch.cache.centroids)
    rows = out_rows or batch.num_tokens
    output = torch.full((rows, batch.num_heads * HEAD_DIM), float("nan"), device=device, dtype=torch.float16)
    returned = impl.forward(layer, batch.query, batch.key, batch.value, batch.cache.kv_cache, metadata,
                            output=output)
    assert returned is output
    return output[: batch.num_tokens].view(batch.num_tokens, batch.num_heads, HEAD_DIM)


def assert_same(got, want, preset):
    """Bitwise, up to the MSE presets' query-rotation GEMM over a different number of rows (one ulp)."""
    if not torch.equal(got, want):
        assert preset != "k8v4"
        torch.testing.assert_close(got.float(), want.float(), **ULP)


VERIFY = dict(q_lens=[3, 3, 3], seq_lens=[4, 13, 22])  # K+1 = 3, one request with a single cached token
MIXED = dict(q_lens=[1, 1, 3, 6], seq_lens=[9, 30, 14, 6])  # decodes, a continuation, a fresh prompt
PREFILL = dict(q_lens=[5, 2], seq_lens=[5, 19])  # a fresh prompt and a continuation, no decodes
BATCHES = {"verify": VERIFY, "mixed": MIXED, "prefill": PREFILL}


def layer_with_buffers(batch, num_rows: int, device) -> SimpleNamespace:
    """An attention layer's TurboQuant state: centroids and decode buffers of num_rows rows."""
    hq = batch.num_heads
    return SimpleNamespace(
        _tq_centroids=batch.cache.centroids,
        _tq_mid_o_buf=torch.empty(num_rows, hq, SPLITS, HEAD_DIM + 1, device=device),
        _tq_output_buf=torch.empty(num_rows, hq, HEAD_DIM, device=device),
        _tq_lse_buf=torch.empty(num_rows, hq, device=device))


# ---------------------------------------------------------------------------
# Patch 0002: uniform K+1 batches routed through one decode launch, into output
# (VLLM_TURBOQUANT_ATTENTION_KERNEL=decode, the default with patch 0007)
# ---------------------------------------------------------------------------


@pytest.fixture
def decode_route():
    SETTINGS.attention_kernel = "decode"


@pytest.fixture
def multi_query():
    SETTINGS.attention_kernel = "multi_query"


@pytest.mark.parametrize("preset", ["k8v4", "4bit_nc", "3bit_nc"] if CUDA else ["4bit_nc"])
def test_verify_batch_routed_into_output(decode_route, patched_tree, pristine_tree, device, preset):
    batch = make_batch(preset, **VERIFY, device=device, seed=5)
    scale = 1.0 / math.sqrt(HEAD_DIM)

    patched = load_backend(patched_tree, flash=False)
    calls = instrument(patched, SPLITS)
    layer = layer_with_buffers(batch, batch.num_tokens, device)
    got = run_forward(patched, batch, device, preset, layer=layer)
    assert len(calls) == 1, "one decode launch for the whole verify batch"
    assert calls[0]["query"].shape[0] == batch.num_tokens
    assert calls[0]["max_num_kv_splits"] == SPLITS
    # The layer's decode buffers (a row per query, B*(K+1)), never replaced from this path.
    assert calls[0]["mid_o_buf"] is layer._tq_mid_o_buf and calls[0]["buf_holder"] is None

    pristine = load_backend(pristine_tree, flash=False)
    pristine_calls = instrument(pristine, SPLITS)
    want = run_forward(pristine, batch, device, preset)
    assert len(pristine_calls) == len(batch.q_lens), "v0.20: one launch per request"
    assert_same(got, want, preset)
    torch.testing.assert_close(got.float(), batch.reference(scale), **TOL)


@pytest.mark.parametrize("flash", [False, True])
def test_verify_shape_routed_without_cached_context(decode_route, patched_tree, device, flash):
    """Under spec decode the verify shape (K+1 tokens per request) is always routed, so that the warm-up
    before a capture compiles what the graph replays; other uniform shapes with a fresh prompt are not."""
    batch = make_batch("4bit_nc", q_lens=[3, 3], seq_lens=[3, 10], device=device, seed=13)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    module = load_backend(patched_tree, flash=flash)
    calls = instrument(module, SPLITS)
    SETTINGS.num_speculative_tokens = 2  # K+1 = 3
    got = run_forward(module, batch, device, "4bit_nc")
    assert len(calls) == 1 and calls[0]["query"].shape[0] == 6
    torch.testing.assert_close(got.float(), batch.reference(scale, routed=True), **TOL)
    calls.clear()
    SETTINGS.num_speculative_tokens = 4  # K+1 = 5: this batch is not the verify shape
    got = run_forward(module, batch, device, "4bit_nc")
    assert len(calls) == 1 and calls[0]["query"].shape[0] == 3, "only the cached request uses the decode kernel"
    torch.testing.assert_close(got.float(), batch.reference(scale), **TOL)


def test_verify_batch_layers_share_inputs_and_buffers(decode_route, patched_tree, device):
    """Layers of a step reuse the routed inputs built by the first; a layer's buffers serve every step."""
    batch = make_batch("4bit_nc", **VERIFY, device=device, seed=9)
    module = load_backend(patched_tree, flash=False)
    instrument(module, SPLITS)
    builder = module.TurboQuantMetadataBuilder(None, [], SETTINGS.vllm_config(), device)
    metadata = builder.build(0, batch.common(device))
    layer = layer_with_buffers(batch, batch.num_tokens, device)
    first = run_forward(module, batch, device, "4bit_nc", metadata=metadata, layer=layer)
    inputs = metadata.spec_verify_inputs
    buffers = (layer._tq_mid_o_buf, layer._tq_output_buf, layer._tq_lse_buf)
    second = run_forward(module, batch, device, "4bit_nc", metadata=metadata, layer=layer)
    assert metadata.spec_verify_inputs is inputs
    assert (layer._tq_mid_o_buf, layer._tq_output_buf, layer._tq_lse_buf) == buffers
    assert torch.equal(first, second)
    block_table, seq_lens, captured = inputs
    assert not captured
    assert block_table.shape[0] == seq_lens.shape[0] == batch.num_tokens
    assert seq_lens.tolist() == [2, 3, 4, 11, 12, 13, 20, 21, 22]


def test_routed_call_never_replaces_decode_buffers(decode_route, patched_tree, device, monkeypatch):
    """Buffers too small for a batch are left alone, eagerly and under capture: the call takes temporaries.

    A buffer allocated during capture would come from the graph memory pool (where piecewise graphs'
    outputs count as free), and one replaced after capture would free memory FULL graphs still write."""
    batch = make_batch("4bit_nc", **VERIFY, device=device, seed=2)
    module = load_backend(patched_tree, flash=False)
    instrument(module, SPLITS)
    layer = layer_with_buffers(batch, 2, device)  # rows: smaller than the batch's 9
    kept = (layer._tq_mid_o_buf, layer._tq_output_buf, layer._tq_lse_buf)
    expected = run_forward(module, batch, device, "4bit_nc", layer=layer)
    assert (layer._tq_mid_o_buf, layer._tq_output_buf, layer._tq_lse_buf) == kept
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    got = run_forward(module, batch, device, "4bit_nc", layer=layer)
    monkeypatch.undo()
    assert (layer._tq_mid_o_buf, layer._tq_output_buf, layer._tq_lse_buf) == kept
    assert torch.equal(got, expected)


# ---------------------------------------------------------------------------
# Patch 0007: the multi-query kernel (VLLM_TURBOQUANT_ATTENTION_KERNEL=multi_query), straight into output
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("preset", "group"), [("k8v4", 6), ("4bit_nc", 2), ("3bit_nc", 4)] if CUDA
                         else [("4bit_nc", 6), ("k8v4", 2)])
def test_verify_batch_multi_query_into_output(multi_query, patched_tree, device, preset, group):
    """A verify batch is one multi-query launch and no decode launch; its result is the decode route's (and
    the reference's) up to float16 value-dot operands."""
    batch = make_batch(preset, **VERIFY, device=device, seed=15, group=group)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    module = load_backend(patched_tree, flash=False)
    calls = instrument(module, SPLITS)
    layer = layer_with_buffers(batch, batch.num_tokens, device)
    mid_o, out_buf = layer._tq_mid_o_buf, layer._tq_output_buf
    with no_host_reads():
        got = run_forward(module, batch, device, preset, layer=layer)
    assert calls == [] and len(module.mq_calls) == 1
    assert module.mq_calls[0]["max_num_kv_splits"] == SPLITS
    assert (layer._tq_mid_o_buf, layer._tq_output_buf) == (mid_o, out_buf)
    torch.testing.assert_close(got.float(), batch.reference(scale), **TOL)

    SETTINGS.attention_kernel = "decode"
    routed = load_backend(patched_tree, flash=False)
    routed_calls = instrument(routed, SPLITS)
    want = run_forward(routed, batch, device, preset, layer=layer_with_buffers(batch, batch.num_tokens, device))
    assert len(routed_calls) == 1 and routed.mq_calls == []
    torch.testing.assert_close(got.float(), want.float(), **TOL)


@pytest.mark.parametrize("preset", ["k8v4", "4bit_nc", "3bit_nc"] if CUDA else ["4bit_nc"])
def test_decode_batch_multi_query_into_output(multi_query, patched_tree, pristine_tree, device, preset):
    """A decode batch (one query per request) is the K1 = 1 case: one multi-query launch, the release's
    decode-kernel result up to float16 dot operands."""
    batch = make_batch(preset, q_lens=[1, 1, 1, 1], seq_lens=[1, 17, 40, 9], device=device, seed=17, group=4)
    module = load_backend(patched_tree, flash=False)
    calls = instrument(module, SPLITS)
    with no_host_reads():
        got = run_forward(module, batch, device, preset, layer=layer_with_buffers(batch, batch.num_tokens, device))
    assert calls == [] and len(module.mq_calls) == 1
    # A one-token prompt in a decode batch reads its K/V back from the cache too (routed=True).
    torch.testing.assert_close(got.float(), batch.reference(1.0 / math.sqrt(HEAD_DIM), routed=True), **TOL)
    pristine = load_backend(pristine_tree, flash=False)
    assert len(instrument(pristine, SPLITS)) == 0
    want = run_forward(pristine, batch, device, preset)
    torch.testing.assert_close(got.float(), want.float(), **TOL)


def test_layer_without_scratch_keeps_decode_route(multi_query, patched_tree, device):
    """The kernel's scratch is the layer's shared decode set; a layer without it (or with too few rows)
    takes the decode route, which needs none."""
    batch = make_batch("4bit_nc", **VERIFY, device=device, seed=16)
    module = load_backend(patched_tree, flash=False)
    calls = instrument(module, SPLITS)
    got = run_forward(module, batch, device, "4bit_nc")
    run_forward(module, batch, device, "4bit_nc", layer=layer_with_buffers(batch, batch.num_tokens - 1, device))
    assert len(calls) == 2 and module.mq_calls == []
    torch.testing.assert_close(got.float(), batch.reference(1.0 / math.sqrt(HEAD_DIM)), **TOL)


def test_multi_query_route_needs_a_supported_head_dim(multi_query, patched_tree, device):
    """Head dims the kernel does not take (not a power of two) keep the decode route."""
    module = load_backend(patched_tree, flash=False)
    impl = module.TurboQuantAttentionImpl(num_heads=2, head_size=HEAD_DIM, scale=1.0, num_kv_heads=1,
                                          kv_cache_dtype="turboquant_4bit_nc")
    assert impl._multi_query
    odd = module.TurboQuantAttentionImpl(num_heads=2, head_size=80, scale=1.0, num_kv_heads=1,
                                         kv_cache_dtype="turboquant_k8v4")
    assert not odd._multi_query
    SETTINGS.attention_kernel = "decode"
    assert not module.TurboQuantAttentionImpl(num_heads=2, head_size=HEAD_DIM, scale=1.0, num_kv_heads=1,
                                              kv_cache_dtype="turboquant_4bit_nc")._multi_query


def test_multi_query_route_steps_aside_on_a_gpu_it_does_not_fit(multi_query, patched_tree, device, monkeypatch,
                                                                  caplog):
    """On a GPU (stood in for: its limits and its launches are the test's) whose shared memory takes no
    tiling, the impl keeps the decode route and says so in one warning; a GPU that takes a narrower tiling
    keeps the kernel, and its launches use that tiling."""
    module = load_backend(patched_tree, flash=False)
    mq = module.tq_mq_device_limits.__globals__
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(module, "tq_mq_device_limits", lambda device: mq["TQMQLimits"](101376, 86))
    monkeypatch.setattr(module, "tq_mq_verify_probe", lambda tiles, **kw: "OutOfResources: shared memory")
    SETTINGS.num_speculative_tokens = 3
    try:
        with caplog.at_level("WARNING"):
            impl = module.TurboQuantAttentionImpl(num_heads=24, head_size=256, scale=1.0, num_kv_heads=4,
                                                  kv_cache_dtype="turboquant_4bit_nc")
        assert not impl._multi_query
        assert [r for r in caplog.records if "does not fit" in r.getMessage()]
        widest = mq["tq_mq_verify_candidates"](4, 6, 256, 4, False, mq["TQMQLimits"](232448, 90))[0]
        monkeypatch.setattr(module, "tq_mq_verify_probe",
                            lambda tiles, **kw: None if tiles.block_n < widest.block_n else "too big")
        module._MULTI_QUERY_FITS.clear()
        impl = module.TurboQuantAttentionImpl(num_heads=24, head_size=256, scale=1.0, num_kv_heads=4,
                                              kv_cache_dtype="turboquant_4bit_nc")
        assert impl._multi_query
        assert mq["_planned_tiles"](torch.device("cuda", 0), 4, 6, 256, 4, False).block_n < widest.block_n
    finally:
        mq["_TILES"].clear()
        SETTINGS.num_speculative_tokens = None


# ---------------------------------------------------------------------------
# Patch 0001: no host read of device tensors, capture guard, CPU mirrors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["patch1", "patched"])
@pytest.mark.parametrize("kind", list(BATCHES))
def test_forward_reads_no_device_tensor_on_host(which, kind, request, device):
    batch = make_batch("4bit_nc", **BATCHES[kind], device=device, seed=len(kind))
    module = load_backend(request.getfixturevalue(f"{which}_tree"), flash=False)
    instrument(module, SPLITS)
    with no_host_reads():
        got = run_forward(module, batch, device, "4bit_nc")
    torch.testing.assert_close(got.float(), batch.reference(1.0 / math.sqrt(HEAD_DIM)), **TOL)


@pytest.mark.parametrize("kind", ["verify", "prefill"])
def test_pristine_forward_reads_device_tensors(pristine_tree, device, kind):
    """What the test above guards against: v0.20.0 reads query_start_loc/seq_lens on the host."""
    batch = make_batch("4bit_nc", **BATCHES[kind], device=device, seed=3)
    module = load_backend(pristine_tree, flash=False)
    instrument(module, SPLITS)
    with no_host_reads(), pytest.raises(HostSync):
        run_forward(module, batch, device, "4bit_nc")


@pytest.mark.parametrize("which", ["patch1", "patched"])
def test_mixed_batch_unchanged(which, request, pristine_tree, device):
    """Decodes + continuation + fresh prompt: the same result as v0.20.0, now from the CPU mirrors."""
    batch = make_batch("4bit_nc", **MIXED, device=device, seed=4)
    module = load_backend(request.getfixturevalue(f"{which}_tree"), flash=False)
    instrument(module, SPLITS)
    got = run_forward(module, batch, device, "4bit_nc")
    pristine = load_backend(pristine_tree, flash=False)
    instrument(pristine, SPLITS)
    assert torch.equal(got, run_forward(pristine, batch, device, "4bit_nc"))


@pytest.mark.parametrize("which", ["patch1", "patched"])
def test_missing_mirror_falls_back_outside_capture(which, request, device):
    """Metadata without a seq_lens mirror (e.g. CommonAttentionMetadata.unpadded()) still works eagerly."""
    batch = make_batch("4bit_nc", **PREFILL, device=device, seed=6)
    module = load_backend(request.getfixturevalue(f"{which}_tree"), flash=False)
    instrument(module, SPLITS)
    builder = module.TurboQuantMetadataBuilder(None, [], SETTINGS.vllm_config(), device)
    metadata = builder.build(0, batch.common(device, mirror=False))
    assert metadata.seq_lens_cpu is None
    got = run_forward(module, batch, device, "4bit_nc", metadata=metadata)
    torch.testing.assert_close(got.float(), batch.reference(1.0 / math.sqrt(HEAD_DIM)), **TOL)


def _fake_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)


@pytest.mark.parametrize("which", ["patch1", "patched"])
def test_per_request_path_refuses_capture(which, request, device, monkeypatch):
    """Host-driven per-request work must never be frozen into a CUDA graph: a clear error instead."""
    module = load_backend(request.getfixturevalue(f"{which}_tree"), flash=False)
    instrument(module, SPLITS)
    batch = make_batch("4bit_nc", **PREFILL, device=device, seed=8)
    _fake_capture(monkeypatch)
    with pytest.raises(RuntimeError, match="cannot run under CUDA graph capture"):
        run_forward(module, batch, device, "4bit_nc")
    # A missing mirror is not silently copied to the host either.
    builder = module.TurboQuantMetadataBuilder(None, [], SETTINGS.vllm_config(), device)
    metadata = builder.build(0, batch.common(device, mirror=False))
    with pytest.raises(RuntimeError, match="cannot run under CUDA graph capture"):
        run_forward(module, batch, device, "4bit_nc", metadata=metadata)


def test_verify_batch_under_capture(patch1_tree, patched_tree, device, monkeypatch):
    """Patch 0001 alone refuses a K+1 batch under capture (vLLM never FULL-captures one with its
    UNIFORM_SINGLE_TOKEN_DECODE support); patch 0002 routes it, which is capturable."""
    batch = make_batch("4bit_nc", **VERIFY, device=device, seed=10)
    first = load_backend(patch1_tree, flash=False)
    instrument(first, SPLITS)
    routed = load_backend(patched_tree, flash=False)
    instrument(routed, SPLITS)
    _fake_capture(monkeypatch)
    with pytest.raises(RuntimeError, match="cannot run under CUDA graph capture"):
        run_forward(first, batch, device, "4bit_nc")
    with no_host_reads():
        got = run_forward(routed, batch, device, "4bit_nc")
    monkeypatch.undo()
    torch.testing.assert_close(got.float(), batch.reference(1.0 / math.sqrt(HEAD_DIM)), **TOL)


@pytest.mark.parametrize("which", ["patch1", "patched"])
def test_fast_path_only_without_cached_rows(which, request, pristine_tree, device):
    """max_query_len == max_seq_len also holds for a cached request shorter than a fresh prompt: v0.20's
    flash fast path then drops that request's cached context; the patched check looks at every row."""
    batch = make_batch("4bit_nc", q_lens=[3, 24], seq_lens=[21, 24], device=device, seed=12)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    want = batch.reference(scale)
    module = load_backend(request.getfixturevalue(f"{which}_tree"), flash=True)
    instrument(module, SPLITS)
    torch.testing.assert_close(run_forward(module, batch, device, "4bit_nc").float(), want, **TOL)
    pristine = load_backend(pristine_tree, flash=True)
    instrument(pristine, SPLITS)
    wrong = run_forward(pristine, batch, device, "4bit_nc").float()
    assert not torch.allclose(wrong[:3], want[:3], **TOL), "v0.20 should miss the cached context here"


# ---------------------------------------------------------------------------
# The builder
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["patch1", "patched"])
def test_builder_keeps_cpu_mirrors(which, request, device):
    module = load_backend(request.getfixturevalue(f"{which}_tree"), flash=False)
    batch = make_batch("4bit_nc", **MIXED, device=device, seed=1)
    builder = module.TurboQuantMetadataBuilder(None, [], SETTINGS.vllm_config(), device)
    cam = batch.common(device)
    md = builder.build(0, cam)
    assert md.query_start_loc_cpu is cam.query_start_loc_cpu
    assert md.seq_lens_cpu is cam.seq_lens_cpu_upper_bound
    assert (md.num_decodes, md.num_decode_tokens) == (2, 2)
    cam = batch.common(device, mirror=False)
    cam._seq_lens_cpu = torch.tensor(batch.seq_lens, dtype=torch.int32)
    assert builder.build(0, cam).seq_lens_cpu is cam._seq_lens_cpu
    captured = builder.build_for_cudagraph_capture(batch.common(device))
    assert captured.seq_lens.as_subclass(torch.Tensor).tolist() == [1] * len(batch.seq_lens)


def test_builder_cudagraph_support(patch1_tree, patched_tree, device):
    cg = load_backend(patched_tree, flash=False)
    builder = cg.TurboQuantMetadataBuilder
    for spec, want in [(None, "UNIFORM_BATCH"), (3, "UNIFORM_BATCH"), (127, "UNIFORM_BATCH"),
                       (128, "UNIFORM_SINGLE_TOKEN_DECODE")]:
        SETTINGS.num_speculative_tokens = spec
        assert builder.get_cudagraph_support(SETTINGS.vllm_config(), None).name == want, spec
    first = load_backend(patch1_tree, flash=False).TurboQuantMetadataBuilder
    for spec in (None, 3):
        SETTINGS.num_speculative_tokens = spec
        assert first.get_cudagraph_support(SETTINGS.vllm_config(), None).name == "UNIFORM_SINGLE_TOKEN_DECODE"


# ---------------------------------------------------------------------------
# CUDA graph: the backend's forward captured as vLLM captures it, replayed with real batches
# ---------------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="CUDA graph capture needs a GPU; runs on the GPU host "
                    "(gpu/host.sh kernels)")
@pytest.mark.parametrize("attention_kernel", ["multi_query", "decode"])
@pytest.mark.parametrize("preset", ["k8v4", "4bit_nc", "3bit_nc"])
def test_forward_in_cuda_graph(patched_tree, pristine_tree, preset, attention_kernel):
    device = "cuda"
    SETTINGS.attention_kernel = attention_kernel
    k1, max_reqs, max_blocks, bs, group, nkv = 4, 4, 32, 16, 4, 2
    n = k1 * max_reqs
    hq = nkv * group
    module = load_backend(patched_tree, flash=False)
    SETTINGS.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    SETTINGS.num_speculative_tokens = k1 - 1  # the captured shape is the verify shape
    impl = module.TurboQuantAttentionImpl(num_heads=hq, head_size=HEAD_DIM, scale=1.0 / math.sqrt(HEAD_DIM),
                                          num_kv_heads=nkv, kv_cache_dtype=f"turboquant_{preset}")
    batches = [make_batch(preset, [k1] * 4, [k1 + 1, 60, 133, 300], device, group=group, nkv=nkv, bs=bs, seed=21),
               make_batch(preset, [k1] * 2, [250, 17], device, group=group, nkv=nkv, bs=bs, seed=22)]
    pool = max(b.cache.kv_cache.shape[0] for b in batches)
    kv = torch.zeros(pool, *batches[0].cache.kv_cache.shape[1:], dtype=torch.uint8, device=device)
    layer = layer_with_buffers(batches[0], n, device)  # as Attention allocates them at init

    # vLLM's persistent buffers, sized for the captured batch (max_reqs requests of K+1 tokens).
    qsl_buf = torch.arange(0, n + 1, k1, dtype=torch.int32, device=device)
    seq_buf = torch.full((max_reqs,), k1, dtype=torch.int32, device=device)
    bt_buf = torch.zeros(max_reqs, max_blocks, dtype=torch.int32, device=device)
    q_buf = torch.zeros(n, hq * HEAD_DIM, dtype=torch.float16, device=device)
    k_buf = torch.zeros(n, nkv * HEAD_DIM, dtype=torch.float16, device=device)
    v_buf = torch.zeros_like(k_buf)
    out_buf = torch.zeros(n, hq * HEAD_DIM, dtype=torch.float16, device=device)
    cam = CommonAttentionMetadata(
        query_start_loc=qsl_buf, query_start_loc_cpu=torch.arange(0, n + 1, k1, dtype=torch.int32),
        seq_lens=seq_buf, num_reqs=max_reqs, num_actual_tokens=n, max_query_len=k1,
        max_seq_len=4096,  # max_model_len, as _build_attention_metadata sets it for capture
        block_table_tensor=bt_buf, slot_mapping=torch.full((n,), -1, device=device),
        seq_lens_cpu_upper_bound=torch.full((max_reqs,), k1, dtype=torch.int32))
    builder = module.TurboQuantMetadataBuilder(None, [], SETTINGS.vllm_config(), device)
    metadata = builder.build_for_cudagraph_capture(cam)  # seq_lens filled with 1

    def step(md):
        impl.forward(layer, q_buf, k_buf, v_buf, kv, md, output=out_buf)

    # vLLM's warm-up before a capture: eager, seq_lens == K+1 (no cached context in the CPU mirrors), routed
    # by the verify-shape rule; that compiles the kernels before the capture.
    warmup = builder.build(0, dataclasses.replace(cam, seq_lens=seq_buf.clone().fill_(k1), max_seq_len=k1))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(warmup)
    torch.cuda.current_stream().wait_stream(stream)
    assert layer._tq_mid_o_buf.shape[0] >= n
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(metadata)  # the capture batch once eagerly too: its routed inputs stay on the metadata
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()  # must rebuild the routed inputs inside the graph
    with torch.cuda.graph(graph):
        step(metadata)

    pristine = load_backend(pristine_tree, flash=False)
    instrument(pristine)  # hands its kernels plain tensors
    for batch in batches:
        b = len(batch.q_lens)
        kv[: batch.cache.kv_cache.shape[0]] = batch.cache.kv_cache
        q_buf.zero_()
        q_buf[: b * k1] = batch.query
        seq_buf.zero_()  # padding requests: seq_len 0, NULL block table rows
        seq_buf[:b] = torch.tensor(batch.seq_lens, dtype=torch.int32, device=device)
        bt_buf.zero_()
        bt_buf[:b, : batch.cache.block_table.shape[1]] = batch.cache.block_table
        graph.replay()
        torch.cuda.synchronize()
        got = out_buf[: b * k1].view(b * k1, hq, HEAD_DIM)
        torch.testing.assert_close(got.float(), batch.reference(1.0 / math.sqrt(HEAD_DIM)), **TOL)
        want = run_forward(pristine, batch, device, preset)  # v0.20 eager, per request
        if attention_kernel == "decode":
            assert_same(got, want, preset)
        else:  # float16 dot operands (see tests/lines/v0_20/kernels/test_turboquant_mq_verify.py)
            torch.testing.assert_close(got.float(), want.float(), **TOL)
