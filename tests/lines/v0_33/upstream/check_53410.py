"""Proof that the #53410 stand-in (``53410.diff``) works: TurboQuant verify batches as single-token decode rows.

Not collected by default (the name does not start with ``test_``); run it by path:

    TRITON_INTERPRET=1 pytest tests/lines/v0_33/upstream/check_53410.py

The tree under test is the 0.33.0 sdist's ``vllm/`` with ``53410.diff`` applied. Its TurboQuant backend file runs
for real (``tq_harness`` stands in for the rest of vLLM) and so does the release's own decode kernel
(``triton_turboquant_decode.py``, interpreted on CPU, compiled on a GPU), over a TurboQuant cache packed by
``references.build_tq_cache``. Every output is compared with a float64 reference over K/V dequantized from the same
bytes: query ``j`` of a request of ``L`` cache positions and ``q`` new tokens sees ``L - q + 1 + j`` of them.

1. The builder claims FULL graphs for verify batches (UNIFORM_BATCH) and treats them as decodes.
2. ``forward`` on a padded uniform verify batch (and a varlen decode batch, and a mixed batch) matches the reference.
3. Graph replay: ``forward`` run with the metadata of the capture batch (Python values frozen at capture), after
   the builder has built the next real batch, still matches that batch's reference, because the rows live in
   the builder's persistent device buffers. On a GPU the same check runs through a real CUDA graph. The
   release fails it (its per-request loop replays the capture batch's choices), which shows the check can fail.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import tq_harness

import vllm_tree
from references import build_tq_cache, tq_attention_ref, tq_verify_ref, tq_verify_rows

HERE = Path(__file__).parent
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
D, HK, GROUP, BS = 128, 2, 2, 16
HQ = HK * GROUP
# Float16 outputs of the decode kernel against float64 math (the tolerance of test_tq_mq_verify.py).
TOL = dict(atol=3e-3, rtol=1e-2)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning",
    "ignore:invalid value encountered:RuntimeWarning", "ignore:divide by zero encountered:RuntimeWarning")

FIGURES: list[str] = []


@pytest.fixture(scope="module")
def tree_53410(v033_pristine_tree, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("v033-53410")
    shutil.copytree(v033_pristine_tree / "vllm", dest / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    diff = str(HERE / "53410.diff")
    subprocess.run(["git", "apply", diff] if shutil.which("git") else ["patch", "-p1", "-s", "-i", diff],
                   cwd=dest, check=True)
    return dest


def _load(tree: Path):
    """The tree's TurboQuant backend module, its decode calls going to the tree's real decode kernel."""
    tq, _, _ = tq_harness.load(tree)
    tq.triton_turboquant_decode_attention = vllm_tree.load_module(tree, DECODE).triton_turboquant_decode_attention
    return tq


@pytest.fixture(scope="module")
def tq(tree_53410):
    return _load(tree_53410)


def _config(num_spec: int | None, max_num_seqs: int = 8):
    spec = None if num_spec is None else SimpleNamespace(num_speculative_tokens=num_spec, parallel_drafting=False)
    return SimpleNamespace(
        speculative_config=spec, use_v2_model_runner=True,
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs, enable_chunked_prefill=False,
                                         max_num_batched_tokens=64),
        model_config=SimpleNamespace(get_num_attention_heads=lambda _pc: HQ, dtype=torch.float16,
                                     max_model_len=4096),
        attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=4))


def _spec():
    return SimpleNamespace(num_kv_heads=HK, head_size=D, block_size=BS)


def _common(tq, q_lens, seq_lens, block_table):
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    n = int(qsl[-1])
    return tq.CommonAttentionMetadata(
        query_start_loc=qsl.to(DEVICE), query_start_loc_cpu=qsl, seq_lens=seq.to(DEVICE), num_reqs=len(q_lens),
        num_actual_tokens=n, max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_table_tensor=block_table,
        slot_mapping=torch.zeros(n, dtype=torch.int64, device=DEVICE), seq_lens_cpu_upper_bound=seq.clone())


def _impl(tq, cache, loop_allowed=False):
    impl = tq_harness.bare_impl(tq.TurboQuantAttentionImpl, HQ, HK, D)
    lay = cache.layout
    impl.tq_config = SimpleNamespace(key_mse_bits=lay.mse_bits, key_packed_size=lay.key_packed_size,
                                     effective_value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8,
                                     norm_correction=lay.norm_correction, value_packed_size=None)
    if not loop_allowed:
        def no_loop(*a, **k):
            raise AssertionError("a decode batch must not reach the per-request loop")
        impl._prefill_attention = no_loop
    return impl


def _forward(impl, cache, query, meta, out=None):
    layer = SimpleNamespace(_tq_cached=True, _tq_Pi=cache.pi, _tq_PiT=cache.pi, _tq_centroids=cache.centroids)
    storage = cache.kv_cache.permute(0, 2, 1, 3).contiguous()  # 0.33's (blocks, Hk, block_size, slot)
    n = query.shape[0]
    if out is None:
        out = torch.full((n, HQ * D), float("nan"), dtype=torch.float16, device=DEVICE)
    return impl.forward(layer, query, query[:, :HK], query[:, :HK], storage, meta, output=out).view(n, HQ, D)


def _query(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, HQ, D, generator=torch.Generator().manual_seed(seed)).half().to(DEVICE)


def _rows(lens, q_lens):
    """(visible length, request) of every query row: row j of request r sees lens[r] - q_r + 1 + j."""
    rows_len = [max(L - q + 1 + j, 0) for L, q in zip(lens, q_lens, strict=True) for j in range(q)]
    rows_req = [r for r, q in enumerate(q_lens) for _ in range(q)]
    return rows_len, rows_req


def _compare(name, got, want, rows_len):
    live = torch.tensor(rows_len, device=got.device) > 0
    err = (got[live].float() - want[live]).abs().max().item()
    FIGURES.append(f"{name}: {int(live.sum())} rows, max |out - float64 ref| = {err:.2e}")
    torch.testing.assert_close(got[live].float(), want[live], **TOL)


def test_builder_claims_full_graphs_and_takes_verify_rows_as_decodes(tq):
    cg = tq.AttentionCGSupport
    builder_cls = tq.TurboQuantAttentionBackend.get_builder_cls()
    for num_spec in (None, 1, 3):
        cfg = _config(num_spec)
        assert builder_cls.get_cudagraph_support(cfg, _spec()) == cg.UNIFORM_BATCH
        builder = builder_cls(_spec(), ["l"], cfg, DEVICE)
        assert builder.reorder_batch_threshold == 1 + (num_spec or 0)
        # Expansion buffers for max_num_seqs * (1 + K) rows, only with spec decode.
        assert hasattr(builder, "_row_seq_lens") == (num_spec is not None)
        if num_spec is not None:
            assert builder._row_seq_lens.shape == (8 * (1 + num_spec),)


@pytest.mark.parametrize("preset", ["4bit_nc", "k8v4", "3bit_nc"])
def test_forward_padded_uniform_verify_batch(tq, preset):
    """K = 3: requests with context, one a short prompt of exactly K1 tokens (no context), one padding request."""
    k1 = 4
    lens = [k1 + 5, 2 * BS + 3, k1, 0]
    q_lens = [k1, k1, k1, 0]
    cache = build_tq_cache(preset, lens, HK, D, BS, DEVICE, seed=17)
    query = _query(sum(q_lens), 5)
    builder = tq.TurboQuantMetadataBuilder(_spec(), ["l"], _config(k1 - 1), DEVICE)
    meta = builder.build(0, _common(tq, q_lens, lens, cache.block_table))
    assert not meta.is_prefill and meta.num_decodes == len(lens)
    assert meta.decode_seq_lens.tolist() == tq_verify_rows(lens[:3], k1)[0]
    out = _forward(_impl(tq, cache), cache, query, meta)
    want, _ = tq_verify_ref(query, cache.keys, cache.values, lens[:3], k1, 1 / math.sqrt(D))
    _compare(f"uniform verify K1={k1} {preset}", out, want, tq_verify_rows(lens[:3], k1)[0])


def test_forward_varlen_decode_batch(tq):
    """Decodes of different lengths up to 1 + K (drafts cut short, plain decodes): the per-token lengths hold."""
    q_lens = [4, 2, 1, 3]
    lens = [9, 2 * BS, 5, BS + 1]
    cache = build_tq_cache("4bit_nc", lens, HK, D, BS, DEVICE, seed=3)
    query = _query(sum(q_lens), 9)
    builder = tq.TurboQuantMetadataBuilder(_spec(), ["l"], _config(3), DEVICE)
    meta = builder.build(0, _common(tq, q_lens, lens, cache.block_table))
    assert not meta.is_prefill
    rows_len, rows_req = _rows(lens, q_lens)
    assert meta.decode_seq_lens.tolist() == rows_len
    out = _forward(_impl(tq, cache), cache, query, meta)
    want = tq_attention_ref(query, cache.keys, cache.values, rows_len, 1 / math.sqrt(D), rows_request=rows_req)
    _compare("varlen decodes 4/2/1/3", out, want, rows_len)


def test_forward_mixed_batch(tq):
    """Two verify rows, then a continuation chunk longer than 1 + K (the per-request loop, host lengths)."""
    q_lens = [4, 4, 7]
    lens = [6, BS + 2, BS + 9]
    cache = build_tq_cache("k8v4", lens, HK, D, BS, DEVICE, seed=11)
    query = _query(sum(q_lens), 13)
    builder = tq.TurboQuantMetadataBuilder(_spec(), ["l"], _config(3), DEVICE)
    meta = builder.build(0, _common(tq, q_lens, lens, cache.block_table))
    assert meta.is_prefill and (meta.num_decodes, meta.num_decode_tokens) == (2, 8)
    out = _forward(_impl(tq, cache, loop_allowed=True), cache, query, meta)
    rows_len, rows_req = _rows(lens, q_lens)
    want = tq_attention_ref(query, cache.keys, cache.values, rows_len, 1 / math.sqrt(D), rows_request=rows_req)
    _compare("mixed: 2 verify + 7-token chunk", out, want, rows_len)


def test_ultraquant_verify_rows_through_its_decode(tree_53410):
    """UltraQuant shares the builder and forward: its decode (the harness's dense stand-in for
    ultraquant_unified_attention, which takes max_query_len=1) gets one row per query token with its exact
    causal length, and a one-query-per-row query_start_loc."""
    tq, uq, rec = tq_harness.load(tree_53410)
    q_lens, ctx, d, bs = [4, 4, 2], [5, 9, 3], 16, 4
    g = torch.Generator().manual_seed(1)
    table = torch.arange(1, 13, dtype=torch.int32).view(3, 4)
    kv = torch.randn(13, bs, HK, 2 * d, generator=g)
    lens = [c + q for c, q in zip(ctx, q_lens, strict=True)]
    query = torch.randn(sum(q_lens), HQ, d, generator=g)
    rows_len, rows_req = _rows(lens, q_lens)
    want = torch.zeros(sum(q_lens), HQ, d)
    for i, (n, r) in enumerate(zip(rows_len, rows_req, strict=True)):
        pos = torch.arange(n)
        kvr = kv[table[r, pos // bs].long(), pos % bs]
        for h in range(HQ):
            w = torch.softmax((kvr[:, h // GROUP, :d] @ query[i, h]) / math.sqrt(d), dim=0)
            want[i, h] = w @ kvr[:, h // GROUP, d:]
    builder = uq.UltraQuantAttentionBackend.get_builder_cls()(
        SimpleNamespace(num_kv_heads=HK, head_size=d, block_size=bs), ["l"], _config(3), "cpu")
    qsl = torch.tensor([0, 4, 8, 10], dtype=torch.int32)
    seq = torch.tensor(lens, dtype=torch.int32)
    cam = tq.CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=3, num_actual_tokens=10,
        max_query_len=4, max_seq_len=max(lens), block_table_tensor=table,
        slot_mapping=torch.zeros(10, dtype=torch.int64), seq_lens_cpu_upper_bound=seq.clone())
    meta = builder.build(0, cam)
    assert meta.decode_query_start_loc.tolist() == list(range(11))
    impl = tq_harness.bare_impl(uq.UltraQuantAttentionImpl, HQ, HK, d)
    layer = SimpleNamespace(_tq_cached=True, _tq_Pi=torch.eye(d), _tq_PiT=torch.eye(d), _tq_centroids=torch.zeros(2))
    rec.seq_lens.clear()
    key = torch.zeros(10, HK, d)
    out = impl.forward(layer, query, key, key, kv.transpose(1, 2), meta, output=torch.full((10, HQ * d), 0.0))
    assert rec.seq_lens == [rows_len]
    torch.testing.assert_close(out.view(10, HQ, d), want, rtol=1e-4, atol=1e-5)
    FIGURES.append(f"UltraQuant verify rows (dense stand-in kernel): lengths {rows_len}, exact")


def _replay_check(tq):
    """Capture on the dummy batch, then replay for a real padded batch: returns (output, reference, rows_len)."""
    k1, padded_reqs = 4, 4
    n = k1 * padded_reqs
    lens = [k1 + 5, 2 * BS + 3, 0, 0]  # two real requests, two padding requests
    q_lens = [k1, k1, 0, 0]
    cache = build_tq_cache("4bit_nc", lens, HK, D, BS, DEVICE, seed=23)
    width = cache.block_table.shape[1]
    # The runner's persistent inputs: the capture and every replay read and write these same tensors.
    qsl_buf = torch.zeros(padded_reqs + 1, dtype=torch.int32, device=DEVICE)
    seq_buf = torch.zeros(padded_reqs, dtype=torch.int32, device=DEVICE)
    bt_buf = torch.zeros(padded_reqs, width, dtype=torch.int32, device=DEVICE)
    q_buf = torch.zeros(n, HQ, D, dtype=torch.float16, device=DEVICE)
    out_buf = torch.zeros(n, HQ * D, dtype=torch.float16, device=DEVICE)

    def common(q_lens_, lens_, table):
        qsl = torch.tensor([0, *torch.tensor(q_lens_).cumsum(0).tolist()], dtype=torch.int32)
        qsl_buf.copy_(qsl)
        seq_buf.copy_(torch.tensor(lens_, dtype=torch.int32))
        bt_buf.zero_()
        bt_buf[: table.shape[0]] = table
        return tq.CommonAttentionMetadata(
            query_start_loc=qsl_buf, query_start_loc_cpu=qsl, seq_lens=seq_buf, num_reqs=padded_reqs,
            num_actual_tokens=n, max_query_len=k1, max_seq_len=max(lens_), block_table_tensor=bt_buf,
            slot_mapping=torch.zeros(n, dtype=torch.int64, device=DEVICE),
            seq_lens_cpu_upper_bound=torch.tensor(lens_, dtype=torch.int32))

    builder = tq.TurboQuantMetadataBuilder(_spec(), ["l"], _config(k1 - 1), DEVICE)
    # The capture batch as the runner makes it: every request K1 tokens, dummy lengths K1.
    capture_meta = builder.build_for_cudagraph_capture(
        common([k1] * padded_reqs, [k1] * padded_reqs, torch.zeros(padded_reqs, width, dtype=torch.int32)))
    impl = _impl(tq, cache, loop_allowed=True)
    query = _query(n, 29)
    query[sum(q_lens):] = 0

    def run():
        _forward(impl, cache, q_buf, capture_meta, out=out_buf)

    graph = None
    if DEVICE == "cuda":
        run()  # warm-up (compiles the kernels)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
    else:
        run()  # what capture records, on CPU: one call with the capture metadata

    # Replay: the builder builds the real batch into its buffers; forward runs with the capture's metadata.
    builder.build(0, common(q_lens, lens, cache.block_table))
    q_buf.copy_(query)
    out_buf.fill_(float("nan"))
    if graph is not None:
        graph.replay()
        torch.cuda.synchronize()
    else:
        run()
    want, _ = tq_verify_ref(query[: sum(q_lens)], cache.keys, cache.values, lens[:2], k1, 1 / math.sqrt(D))
    rows_len = tq_verify_rows(lens[:2], k1)[0]
    return out_buf[: sum(q_lens)].view(-1, HQ, D), want, rows_len


def test_replay_of_the_capture_metadata_serves_the_next_batch(tq):
    out, want, rows_len = _replay_check(tq)
    kind = "CUDA graph replay" if DEVICE == "cuda" else "replay with the capture metadata (CPU)"
    _compare(f"{kind}, padded K1=4 batch", out, want, rows_len)


def test_release_fails_the_same_replay_check(v033_pristine_tree):
    """The check is not vacuous: the release's loop serves the replay with the capture batch's branches."""
    tq = _load(v033_pristine_tree)
    try:
        out, want, rows_len = _replay_check(tq)
    except Exception as exc:  # a real capture of the loop may refuse to run at all
        FIGURES.append(f"release, same replay check: {type(exc).__name__}: {str(exc)[:120]} (expected to fail)")
        return
    live = torch.tensor(rows_len, device=out.device) > 0
    err = (out[live].float() - want[live]).abs().nan_to_num(float("inf")).max().item()
    FIGURES.append(f"release, same replay check: max |out - float64 ref| = {err:.2e} (expected to fail)")
    assert not err <= TOL["atol"] + TOL["rtol"] * want[live].abs().max().item()


def teardown_module(module):
    print("\n" + "\n".join(FIGURES))
