"""The multi-query TurboQuant verify kernel (patch 0007): K+1 verify queries x all query heads of a KV head per
program, each cache tile read and dequantized once.

``triton_turboquant_mq_verify_attention`` (new file ``triton_turboquant_verify.py``) is checked against

- a float64 PyTorch reference over the K/V dequantized from the same cache bytes (``tq_verify_ref``): query
  ``i`` of request ``r`` sees the first ``L_r-K1+1+i`` tokens;
- the routed decode path of patch 0002, built here from the release's own decode kernel: one launch over
  ``B*K1`` rows with the block table rows repeated and the row lengths ``L_r-K1+1+i`` clamped at 0.

Tolerance (``TOL``, on the fp16 outputs, against both oracles): the new kernel's scores are float32-exact (FP8
keys and fp16 queries are exact float16 operands, MSE scores use float32 operands through tf32x3), but its value
dot rounds each softmax weight times its value scale to float16 (relative error <= 2**-11), accumulated in
float32 over up to 1000 positions: a few 1e-4 on outputs of order 1, plus half an fp16 ulp of output rounding on
both sides. Bitwise equality with the decode route is not expected anywhere: its sums run in another order.
Rows without a visible token are 0 here (NaN in the decode route and the reference).
``test_large_scores_keep_float32_score_precision`` holds the scores to float32 precision at realistic magnitudes
(scores of tens), where float16 score operands fail it.

On CPU (``TRITON_INTERPRET=1``) a few cases run; the full grid (every preset x head dim x G x K1 x block size)
and the CUDA graph case run on the GPU host.
"""

from __future__ import annotations

import itertools
import math
import zlib

import pytest
import torch

from references import build_tq_cache, stage_graph_batch, tq_verify_ref, tq_verify_rows
from vllm_tree import load_module

pytestmark = [pytest.mark.kernels, pytest.mark.patch("turboquant-multi-query-verify-kernel")]

VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
PRESETS = ["k8v4", "4bit_nc", "k3v4_nc", "3bit_nc"]
CUDA = torch.cuda.is_available()
GPU_ONLY = "runs on the GPU host (gpu/host.sh kernels): too slow under the CPU interpreter"

# See the module docstring. bfloat16 outputs round to 8 bits: one bf16 ulp at 1 is 2**-7.
TOL = {torch.float16: dict(atol=3e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# Natural-log LSE (float32 in the kernel): absolute error of the float16-operand scores.
LSE_TOL = dict(atol=2e-3, rtol=1e-4)


@pytest.fixture
def mq_ops(patched_tree):
    return load_module(patched_tree, VERIFY)


@pytest.fixture
def decode_ops(pristine_tree):
    return load_module(pristine_tree, DECODE)


def _scratch(n_rows: int, hq: int, d: int, splits: int, device, dtype=torch.float16):
    """Output and scratch buffers, larger than the batch and poisoned with NaN (as reused buffers may be)."""
    return dict(
        output=torch.full((n_rows, hq, d), float("nan"), dtype=dtype, device=device),
        mid_o_buf=torch.full((n_rows + 3, hq + 2, splits + 1, d + 1), float("nan"), device=device),
        q_rot_buf=torch.full((n_rows + 3, hq + 2, d), float("nan"), device=device),
        lse=torch.full((n_rows, hq), float("nan"), device=device),
    )


def _mq(ops, query, cache, k1, scale, bufs, **kw):
    """The new kernel's launcher on a built cache; returns (output, lse)."""
    lay = cache.layout
    kv_cache = kw.pop("kv_cache", cache.kv_cache)
    out = ops.triton_turboquant_mq_verify_attention(
        query, kv_cache, kw.pop("block_table", cache.block_table), kw.pop("seq_lens", cache.seq_lens), k1,
        cache.centroids, scale, lay.mse_bits, lay.key_packed_size, lay.value_bits, bufs["output"],
        bufs["mid_o_buf"], bufs["q_rot_buf"], PiT=cache.pi, key_fp8=lay.key_fp8,
        norm_correction=lay.norm_correction, lse=bufs["lse"], **kw)
    assert out is bufs["output"]
    return out, bufs["lse"]


def _routed_decode(ops, query, cache, k1, scale, splits):
    """Patch 0002's routed call with the release's decode kernel: B*K1 decode rows in one launch."""
    b = query.shape[0] // k1
    offs = torch.arange(1 - k1, 1, device=query.device, dtype=cache.seq_lens.dtype)
    lens = (cache.seq_lens[:b, None] + offs).clamp_min(0).reshape(-1)
    table = cache.block_table[:b].repeat_interleave(k1, dim=0)
    return ops.triton_turboquant_decode_attention(query, cache.kv_cache, table, lens, scale=scale,
                                                  **cache.decode_kwargs, max_num_kv_splits=splits)


def _check(out, lse, want, want_lse, rows_len, dtype, routed=None):
    """Rows with a visible token match the reference (and the routed decode path); the others are 0."""
    live = torch.tensor(rows_len, device=out.device) > 0
    torch.testing.assert_close(out[live].float(), want[live], **TOL[dtype])
    torch.testing.assert_close(lse[live], want_lse[live], **LSE_TOL)
    assert torch.equal(out[~live].float(), torch.zeros_like(out[~live].float()))
    assert bool(torch.isneginf(lse[~live]).all())
    if routed is not None:
        torch.testing.assert_close(out[live].float(), routed[live].float(), **TOL[dtype])


def _case(preset, head_dim, group, k1, block_size, dtype, device, lens, num_kv_heads, seed, splits=None, **kw):
    scale = 1.0 / math.sqrt(head_dim)
    cache = build_tq_cache(preset, lens, num_kv_heads, head_dim, block_size, device, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    n = len(lens) * k1
    hq = num_kv_heads * group
    query = torch.randn(n, hq, head_dim, generator=gen).to(device=device, dtype=dtype)
    return cache, query, scale, n, hq


# ---------------------------------------------------------------------------
# Against the reference and the routed decode path
# ---------------------------------------------------------------------------


def _gpu_matrix():
    for preset, d, group, k1, bs in itertools.product(PRESETS, [128, 256], [1, 2, 4, 6, 8], [1, 2, 4, 8], [16, 32]):
        yield pytest.param(preset, d, group, k1, bs, torch.float16, id=f"{preset}-d{d}-G{group}-K1={k1}-bs{bs}-fp16")
    for preset, d, bs in itertools.product(PRESETS, [128, 256], [16, 32]):
        yield pytest.param(preset, d, 6, 4, bs, torch.bfloat16, id=f"{preset}-d{d}-G6-K1=4-bs{bs}-bf16")


# The CPU interpreter runs every program in Python: each preset once, G = 6 and 1, K1 = 1..8, both block sizes,
# both head dims (float16: the interpreter mis-handles bfloat16 loads).
CPU_CASES = [
    pytest.param("k8v4", 128, 6, 4, 16, torch.float16, id="k8v4-d128-G6-K1=4-bs16-fp16"),
    pytest.param("4bit_nc", 128, 1, 1, 32, torch.float16, id="4bit_nc-d128-G1-K1=1-bs32-fp16"),
    pytest.param("3bit_nc", 128, 2, 8, 16, torch.float16, id="3bit_nc-d128-G2-K1=8-bs16-fp16"),
    pytest.param("k3v4_nc", 256, 4, 2, 32, torch.float16, id="k3v4_nc-d256-G4-K1=2-bs32-fp16"),
    pytest.param("4bit_nc", 128, 6, 2, 32, torch.float16, id="4bit_nc-d128-G6-K1=2-bs32-fp16"),
    pytest.param("k8v4", 256, 8, 1, 16, torch.float16, id="k8v4-d256-G8-K1=1-bs16-fp16"),
]


# The decode route's rows without a visible token divide 0 by 0 (NaN, not compared): NumPy warns under the
# interpreter.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                            "ignore:divide by zero encountered:RuntimeWarning")
@pytest.mark.parametrize(("preset", "head_dim", "group", "k1", "block_size", "dtype"),
                         list(_gpu_matrix()) if CUDA else CPU_CASES)
def test_matches_reference_and_routed_decode(mq_ops, decode_ops, device, preset, head_dim, group, k1, block_size,
                                             dtype):
    bs = block_size
    # Ragged lengths: shorter than K1 (rows that see nothing, or only the first tokens), exactly at block
    # boundaries, one block plus a few, long enough for several KV splits (GPU), and a padding request (0).
    lens = [1, k1, bs, 2 * bs + 3, 5 * bs, 333, 1000, 0] if CUDA else [1, bs, 2 * bs + 3, 0]
    num_kv_heads = 2 if CUDA else 1
    seed = zlib.crc32(f"{preset}-{head_dim}-{group}-{k1}-{bs}".encode())
    cache, query, scale, n, hq = _case(preset, head_dim, group, k1, bs, dtype, device, lens, num_kv_heads, seed)
    splits = 32 if CUDA else 4
    bufs = _scratch(n, hq, head_dim, splits, device, dtype)
    # On CPU: small tiles and splits so that a few dozen tokens cross tiles and splits. On the GPU: the
    # launcher's own choice of splits and tiles (and min_split_len 64 for several splits at 333 and 1000 tokens).
    kw = dict(max_num_kv_splits=splits, min_split_len=64) if CUDA else \
        dict(max_num_kv_splits=splits, num_kv_splits=splits, block_n=16, min_split_len=16)
    out, lse = _mq(mq_ops, query, cache, k1, scale, bufs, **kw)

    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, scale)
    routed = _routed_decode(decode_ops, query, cache, k1, scale, splits)
    rows_len, _ = tq_verify_rows(lens, k1)
    _check(out, lse, want, want_lse, rows_len, dtype, routed)


@pytest.mark.parametrize("num_kv_splits", [1, 3])
def test_many_rows_per_kv_head_take_several_m_tiles(mq_ops, device, num_kv_splits):
    """K1 = 16 with G = 6 at head dim 128: 96 rows, two M tiles of 64 (the accumulator cap), rows 96..127 masked."""
    k1, group, d, bs = 16, 6, 128, 16
    lens = [k1 + 5, 2] if not CUDA else [k1 + 5, 2, 700, 0]
    assert mq_ops.tq_mq_verify_tiles(k1, group, d) == (64, 2)
    assert mq_ops.tq_mq_verify_tiles(k1, group, 256) == (32, 3)  # head dim 256: 32-row tiles
    cache, query, scale, n, hq = _case("k8v4", d, group, k1, bs, torch.float16, device, lens, 1, seed=5)
    bufs = _scratch(n, hq, d, 4, device)
    out, lse = _mq(mq_ops, query, cache, k1, scale, bufs, max_num_kv_splits=4, num_kv_splits=num_kv_splits,
                   block_n=16, min_split_len=16)
    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, scale)
    _check(out, lse, want, want_lse, tq_verify_rows(lens, k1)[0], torch.float16)


@pytest.mark.parametrize("preset", ["4bit_nc", "k3v4_nc"] if not CUDA else PRESETS)
def test_large_scores_keep_float32_score_precision(mq_ops, decode_ops, device, preset):
    """Real models' attention scores reach tens: the scores must be computed to float32 precision, as the
    decode kernel does (rotated queries and centroid vectors rounded to float16 would move a score of 20 by
    about 0.01, every softmax weight by about 1%). The outputs then match the decode route and the float64
    reference to float16 output rounding."""
    k1, group, d, bs = 4, 4, 128, 16
    lens = [k1 + 9, 2 * bs + 5]
    cache, query, scale, n, hq = _case(preset, d, group, k1, bs, torch.float16, device, lens, 1, seed=31)
    query = query * 16  # scores with a standard deviation of about 8
    kw = dict(max_num_kv_splits=4, num_kv_splits=2, block_n=16, min_split_len=16)
    out, lse = _mq(mq_ops, query, cache, k1, scale, _scratch(n, hq, d, 4, device), **kw)
    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, scale)
    routed = _routed_decode(decode_ops, query, cache, k1, scale, 4)
    tight = dict(atol=2e-3, rtol=2e-3)  # float16 outputs of magnitude <= 2: a couple of ulps
    torch.testing.assert_close(out.float(), want, **tight)
    torch.testing.assert_close(out.float(), routed.float(), **tight)
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-5)


# ---------------------------------------------------------------------------
# Layouts, splits, padding
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["4bit_nc"] if not CUDA else PRESETS)
def test_head_major_cache_layout_and_strided_views(mq_ops, device, preset):
    """The (blocks, Hk, block_size, slot) cache of vLLM 0.27+ and strided query/output views give the same bits."""
    k1, group, d, bs, nkv = 3, 6, 128, 16, 2
    lens = [k1 + 1, 2 * bs, 37]
    cache, query, scale, n, hq = _case(preset, d, group, k1, bs, torch.float16, device, lens, nkv, seed=21)
    kw = dict(max_num_kv_splits=4, num_kv_splits=4, block_n=16, min_split_len=16)
    base, _ = _mq(mq_ops, query, cache, k1, scale, _scratch(n, hq, d, 4, device), **kw)

    head_major = cache.kv_cache.permute(0, 2, 1, 3).contiguous()  # (blocks, Hk, bs, slot)
    got, _ = _mq(mq_ops, query, cache, k1, scale, _scratch(n, hq, d, 4, device), kv_cache=head_major,
                 kv_heads_dim=1, **kw)
    assert torch.equal(got, base)

    # The query as a slice of a fused qkv projection, the output as a slice of a wider buffer.
    qkv = torch.zeros(n, hq + 2 * nkv, d, dtype=query.dtype, device=device)
    qkv[:, :hq] = query
    bufs = _scratch(n, hq, d, 4, device)
    wide = torch.full((n, hq + 1, d), float("nan"), dtype=query.dtype, device=device)
    bufs["output"] = wide[:, 1:]
    got, _ = _mq(mq_ops, qkv[:, :hq], cache, k1, scale, bufs, **kw)
    assert torch.equal(got, base)
    assert bool(wide[:, 0].isnan().all())


def test_split_counts_agree(mq_ops, device):
    """One pass (no reduce), several splits, and different tiles compute the same attention."""
    k1, group, d, bs = 4, 2, 128, 16
    lens = [k1 + 2, 3 * bs + 1, 70]
    cache, query, scale, n, hq = _case("3bit_nc", d, group, k1, bs, torch.float16, device, lens, 1, seed=9)
    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, scale)
    rows_len, _ = tq_verify_rows(lens, k1)
    results = []
    for splits, block_n, min_split in [(1, 16, 16), (5, 16, 16), (5, 32, 32), (2, 64, 64)]:
        out, lse = _mq(mq_ops, query, cache, k1, scale, _scratch(n, hq, d, 5, device), max_num_kv_splits=5,
                       num_kv_splits=splits, block_n=block_n, min_split_len=min_split)
        _check(out, lse, want, want_lse, rows_len, torch.float16)
        results.append(out.float())
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("preset", ["k8v4"] if not CUDA else PRESETS)
def test_padding_and_capture_rows_do_not_disturb_real_rows(mq_ops, device, preset):
    """Padding requests (L = 0, table row all NULL_BLOCK_ID) and the capture batch (L = 1): real rows unchanged
    bit for bit, padding rows 0."""
    k1, group, d, bs = 4, 6, 128, 16
    lens = [k1 + 3, 21]
    cache, query, scale, n, hq = _case(preset, d, group, k1, bs, torch.float16, device, lens + [0, 0], 1, seed=7)
    kw = dict(max_num_kv_splits=4, num_kv_splits=4, block_n=16, min_split_len=16)
    real = len(lens) * k1
    alone_cache = type(cache)(**{**cache.__dict__, "seq_lens": cache.seq_lens[:2], "block_table":
                                 cache.block_table[:2]})
    alone, _ = _mq(mq_ops, query[:real], alone_cache, k1, scale, _scratch(real, hq, d, 4, device), **kw)
    padded, _ = _mq(mq_ops, query, cache, k1, scale, _scratch(n, hq, d, 4, device), **kw)
    assert torch.equal(padded[:real], alone)
    assert not bool(padded[real:].any())

    # build_for_cudagraph_capture fills seq_lens with 1: rows 0..K1-2 see nothing, the last row the first token.
    ones = torch.ones(len(lens), dtype=torch.int32, device=device)
    out, lse = _mq(mq_ops, query[:real], alone_cache, k1, scale, _scratch(real, hq, d, 4, device), seq_lens=ones,
                   **kw)
    want, want_lse = tq_verify_ref(query[:real], cache.keys, cache.values, [1, 1], k1, scale)
    _check(out, lse, want, want_lse, tq_verify_rows([1, 1], k1)[0], torch.float16)


def test_launcher_checks_shapes(mq_ops, device):
    k1, d, bs = 4, 128, 16
    cache, query, scale, n, hq = _case("4bit_nc", d, 2, k1, bs, torch.float16, device, [8, 9], 1, seed=1)
    with pytest.raises(ValueError, match="multiple of K1"):
        _mq(mq_ops, query[:7], cache, k1, scale, _scratch(7, hq, d, 4, device))
    bufs = _scratch(n, hq, d, 4, device)
    bufs["mid_o_buf"] = bufs["mid_o_buf"][:, :, :2]
    with pytest.raises(ValueError, match="mid_o_buf"):
        _mq(mq_ops, query, cache, k1, scale, bufs, max_num_kv_splits=4, num_kv_splits=4)
    bufs = _scratch(n, hq, d, 4, device)
    bufs["q_rot_buf"] = None
    with pytest.raises(ValueError, match="q_rot_buf"):
        _mq(mq_ops, query, cache, k1, scale, bufs)
    bufs = _scratch(n, hq, d, 4, device)
    lay = cache.layout
    with pytest.raises(ValueError, match="MSE keys of 2 bits"):
        mq_ops.triton_turboquant_mq_verify_attention(
            query, cache.kv_cache, cache.block_table, cache.seq_lens, k1, cache.centroids[:4], scale, 2,
            lay.key_packed_size, lay.value_bits, bufs["output"], bufs["mid_o_buf"], bufs["q_rot_buf"], PiT=cache.pi,
            norm_correction=True)


# ---------------------------------------------------------------------------
# GPU only: no allocation, CUDA graph capture and replay with new lengths
# ---------------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="CUDA graph capture needs a GPU; " + GPU_ONLY)
@pytest.mark.parametrize("preset", PRESETS)
def test_launch_in_cuda_graph_replays_new_lengths(mq_ops, preset):
    device = "cuda"
    k1, group, d, bs, nkv, splits = 4, 6, 128, 16, 4, 16
    hq = nkv * group
    max_reqs, max_blocks = 6, 64
    n = max_reqs * k1
    scale = 1.0 / math.sqrt(d)
    # Two batches over one paged cache pool: new lengths, tables and request counts (the second is padded with
    # empty requests, as a FULL graph of max_reqs requests replays a smaller batch).
    batches = [[k1 + 1, 40, 77, 130, 5 * bs, 1000], [250, 17, k1 + 2]]
    caches = [build_tq_cache(preset, lens, nkv, d, bs, device, seed=11 + i) for i, lens in enumerate(batches)]
    lay = caches[0].layout

    # Persistent inputs (vLLM's query / seq_lens / block table buffers) and the scratch.
    q_buf = torch.zeros(n, hq, d, device=device, dtype=torch.float16)
    seq_buf = torch.ones(max_reqs, dtype=torch.int32, device=device)  # build_for_cudagraph_capture
    bt_buf = torch.zeros(max_reqs, max_blocks, dtype=torch.int32, device=device)
    kv_buf = torch.zeros(max(c.kv_cache.shape[0] for c in caches), *caches[0].kv_cache.shape[1:],
                         dtype=torch.uint8, device=device)
    bufs = _scratch(n, hq, d, splits, device)

    def launch():
        return mq_ops.triton_turboquant_mq_verify_attention(
            q_buf, kv_buf, bt_buf, seq_buf, k1, caches[0].centroids, scale, lay.mse_bits, lay.key_packed_size,
            lay.value_bits, bufs["output"], bufs["mid_o_buf"], bufs["q_rot_buf"], PiT=caches[0].pi,
            key_fp8=lay.key_fp8, norm_correction=lay.norm_correction, lse=bufs["lse"], max_num_kv_splits=splits,
            min_split_len=64)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()  # compile outside the capture
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        launch()
        torch.cuda.synchronize()
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "the launcher allocated"
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch()  # a host sync here would fail the capture

    gen = torch.Generator().manual_seed(3)
    for lens, cache in zip(batches, caches, strict=True):
        b = len(lens)
        query = torch.randn(b * k1, hq, d, generator=gen).to(device=device, dtype=torch.float16)
        stage_graph_batch(cache, query, q_buf, seq_buf, bt_buf, kv_buf)
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, scale)
        rows_len, _ = tq_verify_rows(lens, k1)
        _check(out[: b * k1], bufs["lse"][: b * k1], want, want_lse, rows_len, torch.float16)
        assert not bool(out[b * k1:].any()), "padding requests must give zeros"
