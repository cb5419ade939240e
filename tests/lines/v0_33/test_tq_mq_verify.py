"""TurboQuant uniform decode and spec-verify batches through the multi-query kernel (the line's patch 0003),
on CPU (Triton interpreted) or a GPU (compiled; the kernel tests run there) against vLLM 0.33.0's own files.

The tree under test is ``v033_tree`` (see conftest.py); on the tree without patch 0003 every test here fails.

1. The kernel (``vllm/v1/attention/ops/triton_turboquant_verify.py``) on 0.33's cache layout: storage
   ``(blocks, Hk, block_size, slot)``, handed over as ``kv_cache.transpose(1, 2)`` as
   ``TurboQuantAttentionImpl.forward`` does, so the kernel reads it through its strides. Checked against a
   float64 reference over K/V dequantized from the same bytes (``references.tq_verify_ref``: query ``i`` of a
   request of ``L`` tokens sees ``L-K1+1+i`` of them) and, at head dim 128, against the release's own decode
   kernel run on ``B*K1`` rows with those lengths. Every preset 0.33 defines (FP8, 4-bit and both 3-bit MSE
   keys), head dims 64, 128 and 256, G = 6 at 256 (Qwen3.6-27B) and more rows per KV head than one M tile
   holds. Rows that see nothing (requests shorter than K1, padding requests with seq_len 0) are written as
   zeros.
2. ``forward`` of the real backend file with the real kernel: a padded uniform verify batch goes through the
   kernel, straight into the layer output, from the device lengths alone (host-side bounds set wrong).
3. The builder: uniform verify (and plain decode) batches are decodes with ``decode_query_len`` set and go to
   the kernel; so do decodes of different lengths, in 1 + K rows each (patch 0006), unless those rows exceed
   the workspace (then the leading decodes of one length do); prefills take the per-request loop; the workspace is
   reserved for ``max_num_seqs * max_decode_query_len`` rows before any capture; FULL graphs with spec decode
   (UNIFORM_BATCH) for TurboQuant again, where (and only where) the builder sends verify batches to the
   kernel; not for UltraQuant, which keeps patch 0001's eager verify. (test_tq_verify_route.py judges the
   same route by behaviour alone, against any tree.)
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import tq_harness

import vllm_tree
from references import build_tq_cache, tq_verify_ref, tq_verify_rows

VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
D = 128
# Float16 outputs; the kernel rounds softmax weight x value scale to float16 (tests/lines/v0_20/kernels/
# test_turboquant_mq_verify.py explains the bound).
TOL = dict(atol=3e-3, rtol=1e-2)
# The kernels run where the cache lies: compiled on a GPU, interpreted on CPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LSE_TOL = dict(atol=2e-3, rtol=1e-4)

pytestmark = [pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning",
    # The release decode route divides 0 by 0 on rows without a visible token (NaN, not compared).
    "ignore:invalid value encountered:RuntimeWarning", "ignore:divide by zero encountered:RuntimeWarning"),
    pytest.mark.patch("turboquant-multi-query-verify-kernel")]


def _query(rows: int, heads: int, seed: int, d: int = D) -> torch.Tensor:
    return torch.randn(rows, heads, d, generator=torch.Generator().manual_seed(seed)).half().to(DEVICE)


@pytest.fixture(scope="module")
def mq_ops(v033_tree):
    return vllm_tree.load_module(v033_tree, VERIFY)


@pytest.fixture(scope="module")
def decode_ops(v033_pristine_tree):
    return vllm_tree.load_module(v033_pristine_tree, DECODE)


def _v033_cache(cache) -> torch.Tensor:
    """The cache as 0.33 stores it, (blocks, Hk, block_size, slot), viewed as forward passes it to kernels."""
    return cache.kv_cache.permute(0, 2, 1, 3).contiguous().transpose(1, 2)


def _mq(ops, query, cache, kv_cache, k1, n_out=None, **kw):
    """The kernel into NaN-poisoned, oversized buffers; returns (output, lse)."""
    n, hq, d = query.shape
    out = torch.full((n_out or n, hq, d), float("nan"), dtype=query.dtype, device=query.device)
    lse = torch.full((n, hq), float("nan"), device=query.device)
    mid_o = torch.full((n + 2, hq + 1, 5, d + 1), float("nan"), device=query.device)
    q_rot = torch.full((n + 2, hq + 1, d), float("nan"), device=query.device)
    lay = cache.layout
    got = ops.triton_turboquant_mq_verify_attention(
        query, kv_cache, cache.block_table, cache.seq_lens, k1, cache.centroids, 1 / math.sqrt(d), lay.mse_bits,
        lay.key_packed_size, lay.value_bits, out, mid_o, q_rot, PiT=cache.pi, key_fp8=lay.key_fp8,
        norm_correction=lay.norm_correction, lse=lse, max_num_kv_splits=4, **kw)
    assert got is out
    return out, lse


def _release_decode(ops, query, cache, kv_cache, k1):
    """The release's decode kernel on B*K1 rows, row (r, i) over the first L_r-K1+1+i tokens."""
    b = query.shape[0] // k1
    offs = torch.arange(1 - k1, 1, dtype=torch.int32, device=query.device)
    lens = (cache.seq_lens[:b, None] + offs).clamp_min(0).reshape(-1)
    table = cache.block_table[:b].repeat_interleave(k1, dim=0)
    return ops.triton_turboquant_decode_attention(query, kv_cache, table, lens, scale=1 / math.sqrt(D),
                                                  **cache.decode_kwargs, max_num_kv_splits=4)


def _check(out, want, rows_len, routed=None, lse=None, want_lse=None):
    live = torch.tensor(rows_len, device=out.device) > 0
    torch.testing.assert_close(out[live].float(), want[live], **TOL)
    if routed is not None:
        torch.testing.assert_close(out[live].float(), routed[live].float(), **TOL)
    if lse is not None:
        torch.testing.assert_close(lse[live], want_lse[live], **LSE_TOL)
        assert bool(torch.isneginf(lse[~live]).all())
    assert not bool(out[~live].any()), "rows without a visible token must be 0"


# ---------------------------------------------------------------------------
# 1. The kernel on 0.33's layout
# ---------------------------------------------------------------------------

CASES = [("k8v4", 1, 1), ("k8v4", 4, 2), ("k8v4", 6, 4), ("4bit_nc", 1, 2), ("4bit_nc", 4, 4), ("4bit_nc", 6, 1)]


@pytest.mark.parametrize(("preset", "group", "k1"), CASES, ids=[f"{p}-G{g}-K1={k}" for p, g, k in CASES])
def test_kernel_on_v033_layout_matches_reference_and_release_decode(mq_ops, decode_ops, preset, group, k1):
    bs, hk = 16, 2
    # Shorter than K1 (2 when K1 = 4), one past K1, exactly one block, past two blocks, a padding request (0).
    lens = [2, k1 + 1, bs, 2 * bs + 3, 0]
    cache = build_tq_cache(preset, lens, hk, D, bs, DEVICE, seed=100 * group + k1)
    kv = _v033_cache(cache)
    assert kv.stride(2) > kv.stride(1), "the kernel must see the head-major storage through strides"
    query = _query(len(lens) * k1, hk * group, k1)
    # Two KV splits of 16-token tiles: a few dozen tokens cross tiles, pages and splits.
    out, lse = _mq(mq_ops, query, cache, kv, k1, num_kv_splits=2, block_n=16, min_split_len=16)
    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, 1 / math.sqrt(D))
    routed = _release_decode(decode_ops, query, cache, kv, k1)
    _check(out, want, tq_verify_rows(lens, k1)[0], routed, lse, want_lse)


# (preset, head dim, KV heads, G, K1, KV splits): 0.33's two 3-bit presets (3-bit MSE keys with 4-bit and
# with 3-bit values), head dims 256 and 64, G = 6 at 256 with 24 query / 4 KV heads (Qwen3.6-27B, MTP K = 3),
# and more query rows per KV head than one BLOCK_M holds: 36 rows in tiles of 32 at 256, 72 in tiles of 64 at 64.
# Splits: the launcher's own choice (one on CPU), or two of 32-token tiles that a request crosses.
WIDE = [("3bit_nc", 256, 4, 6, 4, None), ("k3v4_nc", 256, 2, 6, 6, 2), ("3bit_nc", 64, 2, 12, 6, None)]


@pytest.mark.parametrize(("preset", "d", "hk", "group", "k1", "splits"), WIDE,
                         ids=[f"{p}-D{d}-Hk{h}-G{g}-K1={k}" for p, d, h, g, k, _ in WIDE])
def test_kernel_on_v033_layout_3bit_head_dims_and_m_tiles(mq_ops, preset, d, hk, group, k1, splits):
    bs = 16
    # Shorter than K1 (its first row sees nothing), and three pages (across both splits where there are two).
    lens = [k1 - 1, 2 * bs + 5]
    cache = build_tq_cache(preset, lens, hk, d, bs, DEVICE, seed=d + k1)
    kv = _v033_cache(cache)
    assert kv.stride(2) > kv.stride(1), "the kernel must see the head-major storage through strides"
    _, m_tiles = mq_ops.tq_mq_verify_tiles(k1, group, d)
    assert m_tiles == (2 if k1 * group > 32 else 1), "the case no longer covers what it is there for"
    query = _query(len(lens) * k1, hk * group, k1, d)
    out, lse = _mq(mq_ops, query, cache, kv, k1, num_kv_splits=splits, min_split_len=16)
    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, 1 / math.sqrt(d))
    _check(out, want, tq_verify_rows(lens, k1)[0], lse=lse, want_lse=want_lse)


def _pointed_queries(cache, lens, k1, group, d, top_score):
    """Queries near a key each request holds, scaled so that each row's largest scaled score is top_score (real
    models' scores reach tens), in float16 as the layer gets them."""
    q = torch.randn(len(lens) * k1, cache.keys[0].shape[1] * group, d, generator=torch.Generator().manual_seed(3))
    for i in range(q.shape[0]):
        keys = cache.keys[i // k1][: lens[i // k1]].double().cpu().repeat_interleave(group, dim=1)
        q[i] = 0.3 * q[i] + keys[5] / keys[5].norm(dim=-1, keepdim=True)
        top = torch.einsum("hd,nhd->hn", q[i].double(), keys).amax(-1) / math.sqrt(d)
        q[i] *= (top_score / top)[:, None]
    return q.half().to(DEVICE)


@pytest.mark.parametrize("preset", ["4bit_nc", "3bit_nc", "k3v4_nc"])
def test_mse_scores_keep_float32_precision_at_scores_of_tens(mq_ops, preset):
    """MSE scores as float32 dots at real models' magnitudes (scaled scores of 30): the log-sum-exp within the
    budget of float32 scores (LSE_TOL). One float16 pass of the score dot misses it by 3x-4x (6e-3 to 9e-3);
    fp16x3 is at about 2e-5."""
    d, hk, group, k1, bs = 256, 2, 6, 4, 16
    lens = [40, 70]
    cache = build_tq_cache(preset, lens, hk, d, bs, DEVICE, seed=7)
    query = _pointed_queries(cache, lens, k1, group, d, 30.0)
    out, lse = _mq(mq_ops, query, cache, _v033_cache(cache), k1)
    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, 1 / math.sqrt(d))
    assert float(want_lse.max()) > 29.9, "the scores are no longer of the size this test is about"
    _check(out, want, tq_verify_rows(lens, k1)[0], lse=lse, want_lse=want_lse)


def test_kernel_graph_shapes_one_split_and_capture_lengths(mq_ops):
    """The launcher's own split choice (one pass on CPU), capture metadata (seq_lens filled with 1 by
    build_for_cudagraph_capture) and padding requests: rows that see nothing are 0, the rest as the reference."""
    k1, group, bs, hk = 4, 6, 16, 2
    lens = [k1 + 3, 21, 0, 0]
    cache = build_tq_cache("4bit_nc", lens, hk, D, bs, DEVICE, seed=7)
    kv = _v033_cache(cache)
    query = _query(len(lens) * k1, hk * group, 3)
    out, _ = _mq(mq_ops, query, cache, kv, k1)
    want, _ = tq_verify_ref(query, cache.keys, cache.values, lens, k1, 1 / math.sqrt(D))
    _check(out, want, tq_verify_rows(lens, k1)[0])

    # Capture: every row but the last of a request sees nothing; the last sees the request's first token
    # (the padding requests' block-table rows are 0, a block that exists).
    ones = torch.ones(len(lens), dtype=torch.int32, device=DEVICE)
    capture = type(cache)(**{**cache.__dict__, "seq_lens": ones})
    out, _ = _mq(mq_ops, query, capture, kv, k1)
    real = 2 * k1
    want, _ = tq_verify_ref(query[:real], cache.keys, cache.values, [1, 1], k1, 1 / math.sqrt(D))
    _check(out[:real], want, tq_verify_rows([1, 1], k1)[0])
    assert not bool(out.view(len(lens), k1, -1)[:, :-1].any())


# ---------------------------------------------------------------------------
# Builder / metadata / forward, with the tree's backend files
# ---------------------------------------------------------------------------

HQ, HK = 4, 2


def _config(num_spec: int | None, max_num_seqs: int = 8, splits: int = 4, max_tokens: int = 64):
    return tq_harness.vllm_config(num_spec, HQ, max_num_seqs, splits, max_tokens)


def _spec(head_size: int, block_size: int = 4, preset: str = "k8v4"):
    """The layer's KV cache spec as the builder reads it (on a GPU its route probes the preset's kernels)."""
    return SimpleNamespace(num_kv_heads=HK, head_size=head_size, block_size=block_size,
                           kv_quant_mode=SimpleNamespace(name=f"TURBOQUANT_{preset.upper()}"))


def _common(tq, q_lens, seq_lens, block_table, device="cpu", host_seq_lens=None, max_seq_len=None):
    """As the runner builds it: device tensors, and the CPU copies of query_start_loc and upper-bound lengths
    (``host_seq_lens`` and ``max_seq_len`` when given, else exact)."""
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    n = int(qsl[-1])
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    host = seq.clone() if host_seq_lens is None else torch.tensor(host_seq_lens, dtype=torch.int32)
    return tq.CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq.to(device), num_reqs=len(q_lens),
        num_actual_tokens=n, max_query_len=max(q_lens), max_seq_len=max_seq_len or max(seq_lens),
        block_table_tensor=block_table, slot_mapping=torch.zeros(n, dtype=torch.int64, device=device),
        seq_lens_cpu_upper_bound=host)


@pytest.fixture(scope="module")
def mods(v033_tree):
    return tq_harness.load(v033_tree)


def test_graph_support_and_reorder_threshold(mods):
    """TurboQuant reports UNIFORM_BATCH (FULL graphs for K+1 verify batches) where, and only where, its builder
    sends a padded uniform verify batch to the graph-safe kernel: all its requests decodes of
    ``decode_query_len`` K+1, the reorder threshold K+1. The release reports UNIFORM_BATCH too, but builds that
    batch as prefills for the host-driven loop (threshold 1), so the level is only asserted together with the
    route that makes it safe. Head dims the kernel does not take keep patch 0001 (less than UNIFORM_BATCH,
    threshold 1, the loop for verify batches). UltraQuant takes the same route to its own kernel (patch 0007)."""
    tq, uq, _ = mods
    cg = tq.AttentionCGSupport
    tq_builder = tq.TurboQuantAttentionBackend.get_builder_cls()
    builders = [("TurboQuant", tq_builder, 128), ("TurboQuant", tq_builder, 512)]
    if uq is not None:  # 0.27.1 has no UltraQuant
        builders.append(("UltraQuant", uq.UltraQuantAttentionBackend.get_builder_cls(), 128))
    for num_spec in (3, 1, None):
        cfg = _config(num_spec)
        k1 = 1 + (num_spec or 0)
        q_lens, seq_lens = [k1, k1, k1, 0], [k1 + 5, k1 + 9, k1 + 2, 0]
        common = _common(tq, q_lens, seq_lens, torch.zeros(4, 4, dtype=torch.int32))
        for name, builder_cls, head in builders:
            support = builder_cls.get_cudagraph_support(cfg, _spec(head))
            builder = builder_cls(_spec(head), ["l"], cfg, "cpu")
            meta = builder.build(0, common)
            got = (support, builder.reorder_batch_threshold,
                   (meta.num_decodes, getattr(meta, "decode_query_len", 0)))
            where = f"{name}, head dim {head}, K+1={k1}: (graph support, threshold, (decodes, decode_query_len))"
            if head == 128:
                assert got == (cg.UNIFORM_BATCH, k1, (4, k1)), where
            else:
                # The decode kernel takes plain decodes, the per-request loop verify batches.
                assert cg.NEVER.value < support.value < cg.UNIFORM_BATCH.value, where
                assert got[1:] == (1, (4 if k1 == 1 else 0, 0)), where


def _float_case(q_lens, ctx, block_size=4, d=16, seed=0):
    """A float K|V cache (the harness's decode stand-in reads it) with requests of ctx cached tokens plus
    q_lens new ones; the exact causal reference of every query row."""
    g = torch.Generator().manual_seed(seed)
    nb = 4
    kv = torch.randn(nb * len(q_lens) + 1, block_size, HK, 2 * d, generator=g)
    table = torch.arange(1, nb * len(q_lens) + 1, dtype=torch.int32).view(len(q_lens), nb)
    seq_lens = [c + q if q else 0 for c, q in zip(ctx, q_lens, strict=True)]
    n = sum(q_lens)
    query = torch.randn(n, HQ, d, generator=g)
    ref = torch.zeros(n, HQ, d)
    row = 0
    for r, q in enumerate(q_lens):
        for j in range(q):
            pos = torch.arange(ctx[r] + j + 1)
            kvr = kv[table[r, pos // block_size].long(), pos % block_size]
            for h in range(HQ):
                kh = h // (HQ // HK)
                w = torch.softmax((kvr[:, kh, :d] @ query[row, h]) / math.sqrt(d), dim=0)
                ref[row, h] = w @ kvr[:, kh, d:]
            row += 1
    return kv, table, seq_lens, query, ref


def _forward(tq, impl, meta, kv, query, d=16):
    n = query.shape[0]
    layer = SimpleNamespace(_tq_cached=True, _tq_Pi=torch.eye(d), _tq_PiT=torch.eye(d), _tq_centroids=torch.zeros(2))
    out = torch.full((n, HQ * d), float("nan"))
    key = torch.zeros(n, HK, d)
    # 0.33 stores (blocks, Hk, block_size, slot); forward hands kernels its transpose(1, 2).
    kv = tq_harness.forward_cache(tq, kv.transpose(1, 2))
    return impl.forward(layer, query, key, key, kv, meta, output=out).view(n, HQ, d)


def _impl(tq, cls, d=16):
    impl = tq_harness.bare_impl(cls, HQ, HK, d)
    impl._multi_query = True  # TurboQuantAttentionImpl.__init__ sets it (no FlyDSL, head dim 16..256)
    return impl


# q_lens, cached tokens, spec tokens[, max_num_batched_tokens] -> (num_decodes, decode_query_len, kernel calls
# (k1, rows), loop used). Decodes of different lengths take 1 + K rows each (0006); with 8 batched tokens at most
# the workspace holds two requests' rows, so a third keeps the leading decodes of one length on the kernel.
DISPATCH = {
    "uniform-verify": ([4, 4, 4], [5, 9, 2], 3, (3, 4, [(4, 12)], False)),
    "padded-uniform-verify": ([4, 4, 0], [5, 9, 0], 3, (3, 4, [(4, 8)], False)),
    "plain-decode": ([1, 1, 1], [5, 9, 2], None, (3, 1, [(1, 3)], False)),
    "verify-then-shorter": ([4, 2], [6, 7], 3, (2, 4, [(4, 8)], False)),
    "shorter-then-verify": ([2, 4, 4], [6, 7, 3], 3, (3, 4, [(4, 12)], False)),
    "no-match-in-the-middle": ([4, 1, 4], [6, 7, 3], 3, (3, 4, [(4, 12)], False)),
    "padding-in-the-middle": ([4, 0, 4], [5, 0, 6], 3, (3, 4, [(4, 12)], False)),
    "prefill-chunk-first": ([6, 4], [3, 8], 3, (0, 0, [], True)),
    "verify-prefill": ([4, 2, 6], [6, 7, 3], 3, (2, 4, [(4, 8)], True)),
    "over-the-workspace": ([4, 1, 4], [6, 7, 3], 3, 8, (1, 4, [(4, 4)], True)),
}


@pytest.mark.parametrize("name", list(DISPATCH))
def test_builder_routes_uniform_decodes_to_the_kernel_and_the_rest_to_the_loop(mods, name):
    tq, _, rec = mods
    q_lens, ctx, num_spec, *max_tokens, (num_decodes, k1, calls, loop) = DISPATCH[name]
    kv, table, seq_lens, query, ref = _float_case(q_lens, ctx)
    builder = tq.TurboQuantMetadataBuilder(_spec(16), ["l"], _config(num_spec, 8, 4, *max_tokens), "cpu")
    meta = builder.build(0, _common(tq, q_lens, seq_lens, table))
    assert (meta.num_decodes, meta.decode_query_len) == (num_decodes, k1)
    rec.seq_lens.clear()
    rec.mq_calls.clear()
    out = _forward(tq, _impl(tq, tq.TurboQuantAttentionImpl), meta, kv, query)
    assert [(c["k1"], c["rows"]) for c in rec.mq_calls] == calls
    # The stand-in kernel reports its rows to the recorder too: the loop made the other calls.
    assert (len(rec.seq_lens) > len(calls)) == loop
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_ultraquant_keeps_the_per_request_loop_with_its_route_off(mods, v033_tree, monkeypatch):
    """VLLM_TURBOQUANT_ATTENTION_KERNEL=decode turns UltraQuant's route (patch 0007) off: verify batches are
    prefills of the per-request loop, as with patch 0001 alone."""
    tq_harness.skip_without_ultraquant(v033_tree)
    tq, uq, rec = mods
    monkeypatch.setattr(getattr(uq, "envs", SimpleNamespace()), "VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode",
                        raising=False)
    q_lens, ctx = [4, 4], [5, 9]
    kv, table, seq_lens, query, ref = _float_case(q_lens, ctx)
    meta = uq.UltraQuantMetadataBuilder(_spec(16), ["l"], _config(3), "cpu").build(
        0, _common(tq, q_lens, seq_lens, table))
    assert (meta.num_decodes, meta.decode_query_len) == (0, 0)
    rec.mq_calls.clear()
    rec.seq_lens.clear()
    _forward(tq, tq_harness.bare_impl(uq.UltraQuantAttentionImpl, HQ, HK, 16), meta, kv, query)
    assert not rec.mq_calls and rec.seq_lens


def _nbytes(shapes) -> int:
    return sum(-(-math.prod(s) * torch.empty(0, dtype=dt).element_size() // 256) * 256 for s, dt in shapes)


def test_workspace_reserved_before_capture_for_every_uniform_batch(mods, monkeypatch):
    """The builder's __init__ reserves the kernel's scratch for max_num_seqs * max_decode_query_len rows, so
    the largest uniform verify batch never grows (and never moves) the workspace a graph points to; nor does
    a batch of decodes of different lengths."""
    tq, _, rec = mods
    requests: list[tuple] = []

    class Workspace:
        def get_simultaneous(self, *shapes):
            requests.append(shapes)
            return [torch.empty(s, dtype=dt) for s, dt in shapes]

    monkeypatch.setattr(tq, "is_workspace_manager_initialized", lambda: True)
    monkeypatch.setattr(tq, "current_workspace_manager", lambda: Workspace())
    # The reservation is for a GPU's launches (a CPU run is unsplit): a stand-in device 0.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    max_num_seqs, num_spec, splits = 3, 3, 4
    # The queries of _float_case are float32: the model's dtype, in which the padded rows are reserved.
    config = tq_harness.vllm_config(num_spec, HQ, max_num_seqs, splits, dtype=torch.float32)
    builder = tq.TurboQuantMetadataBuilder(_spec(16), ["l"], config, "cpu")
    rows = max_num_seqs * (1 + num_spec)
    split_rows = rows * 2  # the stand-in kernel's two splits a launch (tq_harness.mq_stand_in)
    want = (((split_rows * HQ * 17,), torch.float32),) + (((rows, HQ, 16), torch.float32),) * 3
    assert want in requests, f"no reservation for {rows} rows of multi-query scratch: {requests}"
    reserved = max(_nbytes(r) for r in requests)

    q_lens, ctx = [4] * max_num_seqs, [5, 9, 2]
    kv, table, seq_lens, query, ref = _float_case(q_lens, ctx)
    meta = builder.build(0, _common(tq, q_lens, seq_lens, table))
    requests.clear()
    rec.mq_calls.clear()
    impl = _impl(tq, tq.TurboQuantAttentionImpl)
    impl.max_num_kv_splits = splits
    out = _forward(tq, impl, meta, kv, query)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert [(c["k1"], c["rows"]) for c in rec.mq_calls] == [(4, rows)]
    assert len(requests) == 1 and _nbytes(requests[0]) <= reserved
    assert rec.mq_calls[0]["mid_o"] == want[0][0] and rec.mq_calls[0]["q_rot"] == want[1][0]

    # Decodes of different lengths (0006) take max_num_seqs requests' rows too, from the same reservation.
    q_lens = [4, 1, 4]
    kv, table, seq_lens, query, ref = _float_case(q_lens, ctx)
    meta = builder.build(0, _common(tq, q_lens, seq_lens, table))
    requests.clear()
    rec.mq_calls.clear()
    out = _forward(tq, impl, meta, kv, query)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert [(c["k1"], c["rows"]) for c in rec.mq_calls] == [(4, rows)]
    assert len(requests) == 1 and _nbytes(requests[0]) <= reserved


# ---------------------------------------------------------------------------
# 2. forward with the real kernel on a real TurboQuant cache
# ---------------------------------------------------------------------------


def _real_impl(tq, hq: int, d: int, lay):
    impl = tq_harness.bare_impl(tq.TurboQuantAttentionImpl, hq, HK, d)
    impl._multi_query = True
    impl.tq_config = SimpleNamespace(key_mse_bits=lay.mse_bits, key_packed_size=lay.key_packed_size,
                                     effective_value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8,
                                     norm_correction=lay.norm_correction)
    return impl


@pytest.mark.parametrize(("preset", "num_spec"), [("4bit_nc", 3), ("k8v4", None)])
def test_forward_runs_padded_uniform_batch_through_the_kernel(v033_tree, mq_ops, decode_ops, preset, num_spec):
    tq, _, rec = tq_harness.load(v033_tree, mq=mq_ops)
    k1, group, bs = 1 + (num_spec or 0), 2, 16
    lens = [k1 + 5, 2 * bs, 0]  # the last request pads the batch (q_len 0, seq_len 0)
    cache = build_tq_cache(preset, lens, HK, D, bs, DEVICE, seed=17)
    hq = HK * group
    q_lens = [k1, k1, 0]
    n = 2 * k1
    query = _query(n, hq, 5)
    builder = tq.TurboQuantMetadataBuilder(_spec(D, bs, preset), ["l"], _config(num_spec), DEVICE)
    meta = builder.build(0, _common(tq, q_lens, lens, cache.block_table, DEVICE))
    assert (meta.num_decodes, meta.decode_query_len) == (3, k1)

    impl = _real_impl(tq, hq, D, cache.layout)
    layer = SimpleNamespace(_tq_cached=True, _tq_Pi=cache.pi, _tq_PiT=cache.pi, _tq_centroids=cache.centroids)
    storage = cache.kv_cache.permute(0, 2, 1, 3).contiguous()  # 0.33's (blocks, Hk, block_size, slot)
    out = torch.full((n, hq * D), float("nan"), dtype=torch.float16, device=DEVICE)
    rec.seq_lens.clear()
    got = impl.forward(layer, query, query[:, :HK], query[:, :HK], tq_harness.forward_cache(tq, storage), meta,
                       output=out)
    assert got is out and not rec.seq_lens, "the uniform batch must not reach the decode kernel or the loop"
    want, _ = tq_verify_ref(query, cache.keys, cache.values, lens[:2], k1, impl.scale)
    routed = _release_decode(decode_ops, query, cache, storage.transpose(1, 2), k1)
    _check(out.view(n, hq, D), want, tq_verify_rows(lens[:2], k1)[0], routed)


def test_kernel_route_never_reads_the_host_length_bound(v033_tree, mq_ops):
    """A padded verify batch whose host-side lengths are wrong both ways (seq_lens_cpu_upper_bound too large on
    one request, too small on another, non-zero on the padding request; max_seq_len below every real length)
    gives, through the builder and forward, the causal attention of the device seq_lens: the kernel route
    reads no host-side length."""
    tq, _, rec = tq_harness.load(v033_tree, mq=mq_ops)
    num_spec, group, bs, d = 3, 2, 16, 64
    k1, hq = 1 + num_spec, HK * group
    lens = [k1 + 5, 2 * bs + 3, 0]
    cache = build_tq_cache("k8v4", lens, HK, d, bs, DEVICE, seed=23)
    n = 2 * k1
    query = _query(n, hq, 9, d)
    builder = tq.TurboQuantMetadataBuilder(_spec(d, bs), ["l"], _config(num_spec), DEVICE)
    common = _common(tq, [k1, k1, 0], lens, cache.block_table, DEVICE,
                     host_seq_lens=[lens[0] + 3, lens[1] - 20, 7], max_seq_len=2)
    meta = builder.build(0, common)
    assert (meta.num_decodes, meta.decode_query_len) == (3, k1)
    impl = _real_impl(tq, hq, d, cache.layout)
    layer = SimpleNamespace(_tq_cached=True, _tq_Pi=cache.pi, _tq_PiT=cache.pi, _tq_centroids=cache.centroids)
    storage = cache.kv_cache.permute(0, 2, 1, 3).contiguous()
    out = torch.full((n, hq * d), float("nan"), dtype=torch.float16, device=DEVICE)
    rec.seq_lens.clear()
    impl.forward(layer, query, query[:, :HK], query[:, :HK], tq_harness.forward_cache(tq, storage), meta, output=out)
    assert not rec.seq_lens, "the uniform batch must not reach the decode kernel or the loop"
    want, _ = tq_verify_ref(query, cache.keys, cache.values, lens[:2], k1, impl.scale)
    _check(out.view(n, hq, d), want, tq_verify_rows(lens[:2], k1)[0])
