"""The multi-query kernel fits the GPU it runs on, or its route steps aside (the line's patch 0003), on CPU.

1. The planner (``tq_mq_verify_candidates``): tilings best first, each within the device's shared memory by the
   lower bound of what the score dot stages (hi/lo float16 operands for fp16x3). On the H100 (232448 B) and on
   the 99 KiB consumer parts (RTX 3090/4090/5090, A5000/A6000: 101376 B) the MSE presets of Qwen3.6-27B with MTP
   K=3 (24/4 heads, D 256) take the same widest tiles, 32 rows x 32 tokens (48-64 KiB staged); in tf32x3 the
   3-bit ones staged 128 KiB there and took two 16-row tiles. ROCm and sm_75 score in float32 (``ieee``).
2. ``tq_mq_verify_select`` takes the first tiling the device accepts and launches use it from then on.
3. The kernel at the consumer tiles and in float32 scores matches the float64 reference (interpreted here; on a
   GPU under the emulated limit in tests/gpu).
4. The backend's route (``_multi_query_route``): when the device accepts no tiling, or
   ``VLLM_TURBOQUANT_ATTENTION_KERNEL=decode``, TurboQuant keeps patch 0001's route (decode kernel for decodes,
   per-request loop for verify batches, UNIFORM_SINGLE_TOKEN_DECODE) and says so in one warning; when it accepts
   one, FULL graphs (UNIFORM_BATCH) and the accepted tiles. The device is stood in for by the probe only: what
   a real launch decides is shown on the GPU (tests/gpu) and by the compile matrix (tests/gpu_fit).
5. The workspace is reserved for the most query heads of any TurboQuant layer (a drafter's may exceed the
   target's), for at most max_num_batched_tokens rows, and for the KV splits launches actually take; each layer
   reserves its share when it is built, inside vLLM's memory profile: the tree's own WorkspaceManager then holds,
   to the byte, what the largest launches need (rows x heads x head dim x dtype size, worked out here from the
   batch limits and the launches' split rule).
6. Every kernel variant serving launches was launched by the route's probes before the first capture (K+1 from
   1 to 1 + K, the preset's norm correction, one split and several, the layer's cache layout), so nothing
   compiles while serving; on sm_75 every one of them compiles within the limit (slow: compiled ahead of time).
7. The lower bound of the staged bytes is what Triton compiles: the kernel compiled ahead of time for sm_90
   (``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``, gpu/fit/fitmatrix.py's compile of
   the probe's launch) needs exactly that much shared memory (``metadata.shared``).
"""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import launch_keys
import pytest
import torch
import tq_harness

import references
import vllm_tree
from references import build_tq_cache, tq_verify_ref, tq_verify_rows

VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H100, RTX_3090, T4, MI300X = (232448, 90, False), (101376, 86, False), (65536, 75, False), (65536, 0, True)
A100 = (166912, 80, False)
MSE = {"4bit_nc": 4, "k3v4_nc": 3, "3bit_nc": 3}

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"),
    pytest.mark.patch("turboquant-multi-query-verify-kernel"),
]


@pytest.fixture(scope="module")
def mq(v033_tree):
    return vllm_tree.load_module(v033_tree, VERIFY)


def _limits(mq, device):
    return mq.TQMQLimits(*device)


@pytest.mark.parametrize("mse_bits", sorted(set(MSE.values())))
def test_consumer_parts_get_tiles_whose_operands_fit(mq, mse_bits):
    """Qwen3.6-27B, MTP K=3: the H100 keeps 32 rows x 32 tokens (3-bit keys: 64 KiB staged in fp16x3; 4-bit keys,
    whose 64-token step spills, 48 KiB); a 99 KiB part gets no tiling over its limit and the same first tiles:
    one pass over the cache (all 24 rows in one 32-row tile) for 3- and 4-bit keys; in tf32x3 (128 KiB) 3-bit
    keys would take two 16-row tiles there (32 x 16 tiles come last: slower on the H100)."""
    k1, group, d = 4, 6, 256
    h100 = mq.tq_mq_verify_candidates(k1, group, d, mse_bits, False, _limits(mq, H100))
    consumer = mq.tq_mq_verify_candidates(k1, group, d, mse_bits, False, _limits(mq, RTX_3090))
    widest = h100[0]
    assert (widest.block_m, widest.m_tiles, widest.block_n) == (32, 1, 32)
    assert widest.precision == "fp16x3"
    assert mq.tq_mq_staged_bytes(widest.block_m, widest.block_n, d, mse_bits, False) == (
        49152 if mse_bits == 4 else 65536)
    assert widest == consumer[0]
    assert mq.tq_mq_staged_bytes(32, 32, d, mse_bits, False, "tf32x3") == (98304 if mse_bits == 4 else 131072)
    for tiles in consumer:
        assert mq.tq_mq_staged_bytes(tiles.block_m, tiles.block_n, d, mse_bits, False) <= RTX_3090[0]
    # 16-token steps only after every wider one.
    steps = [t.block_n for t in consumer]
    assert steps == sorted(steps, key=lambda n: n < 32)


def test_a100_takes_narrower_steps_at_64_rows_of_4bit_keys(mq):
    """Llama-8B (32/8, D 128) with K+1 = 16 is 64 rows: on sm_8x ptxas spills 4-5 KB per thread at BLOCK_N 128
    with 4-bit keys (tests/gpu_fit), so the A100 starts at 64 tokens per step; the H100 keeps 128, and FP8 or
    3-bit keys and fewer rows are left as they were."""
    a100 = mq.tq_mq_verify_candidates(16, 4, 128, 4, False, _limits(mq, A100))
    h100 = mq.tq_mq_verify_candidates(16, 4, 128, 4, False, _limits(mq, H100))
    assert (a100[0].block_m, a100[0].block_n) == (64, 64)
    assert (h100[0].block_m, h100[0].block_n) == (64, 128)
    assert all(t.block_n <= 64 for t in a100 if t.block_m == 64)
    assert any((t.block_m, t.block_n) == (32, 128) for t in a100)
    assert mq.tq_mq_verify_candidates(4, 4, 128, 4, False, _limits(mq, A100))[0].block_n == 128
    assert mq.tq_mq_verify_candidates(16, 4, 128, 0, True, _limits(mq, A100))[0].block_n == 128
    assert mq.tq_mq_verify_candidates(16, 4, 128, 3, False, _limits(mq, A100))[0].block_n == 64


# (BLOCK_M, head dim, MSE bits) -> a geometry and K+1 of gpu/fit/fitmatrix.py whose K1 x G rows take that
# BLOCK_M: 16 x 128 (Llama-8B, G 4, K+1 4), 32 x 128 (Qwen3-30B, G 8), 64 x 128 (Llama-8B, K+1 16), 16 x 256
# (Qwen3.6-27B, G 6, K+1 2: 12 rows), 32 x 256 (K+1 4: 24 rows).
COMPILED_TILES = {(16, 128, 4): ("Llama-3.1-8B", 4), (32, 128, 4): ("Qwen3-30B-A3B", 4),
                  (64, 128, 4): ("Llama-3.1-8B", 16), (16, 256, 4): ("Qwen3.6-27B TP1", 2),
                  (32, 256, 4): ("Qwen3.6-27B TP1", 4), (16, 128, 3): ("Llama-3.1-8B", 4),
                  (32, 256, 3): ("Qwen3.6-27B TP1", 4)}


def test_staged_bytes_match_the_compiled_kernels(mq, v033_tree, tmp_path):
    """The lower bound equals metadata.shared of the MSE kernels compiled ahead of time for sm_90 (fp16x3 scores,
    BLOCK_N the widest: 128 tokens at D 128, 64 at D 256, half that for 3-bit keys), as the probe launches them:
    tq_mq_aot.py compiles them with Triton in an interpreter of its own (this one interprets), nothing cached."""
    cases, staged = [], {}
    for (block_m, d, bits), (geometry, k1) in COMPILED_TILES.items():
        block_n = (128 if d <= 128 else 64) // (1 if bits == 4 else 2)
        cases.append([block_m, block_n, d, "4bit_nc" if bits == 4 else "3bit_nc", geometry, k1])
        staged[(block_m, d, bits)] = mq.tq_mq_staged_bytes(block_m, block_n, d, bits, False)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["VLLM_PATCH_GPU_FIT_CACHE"] = str(tmp_path)  # every compile runs
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("tq_mq_aot.py")), str(v033_tree / VERIFY),
                           "sm_90"], input=json.dumps(cases), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout)
    errors = [(case, r) for case, r in zip(cases, results, strict=True) if "error" in r]
    assert not errors, errors
    compiled = {key: r["shared"] for key, r in zip(COMPILED_TILES, results, strict=True)}
    assert staged == compiled


def test_precision_follows_the_platform(mq):
    assert mq.tq_mq_score_precision(_limits(mq, H100)) == "fp16x3"
    assert mq.tq_mq_score_precision(_limits(mq, RTX_3090)) == "fp16x3"
    assert mq.tq_mq_score_precision(_limits(mq, T4)) == "ieee"
    assert mq.tq_mq_score_precision(_limits(mq, MI300X)) == "ieee"
    for tiles in mq.tq_mq_verify_candidates(4, 6, 256, 4, False, _limits(mq, MI300X)):
        assert tiles.precision == "ieee"
        assert mq.tq_mq_staged_bytes(tiles.block_m, tiles.block_n, 256, 4, False, "ieee") <= MI300X[0]


def test_nothing_fits_a_tiny_limit(mq):
    tiny = mq.TQMQLimits(8192, 86)
    assert mq.tq_mq_verify_candidates(4, 6, 256, 4, False, tiny) == []
    tiles, why = mq.tq_mq_verify_select(4, 6, 256, 4, False, tiny, fits=lambda t: None)
    assert tiles is None and why


def test_select_takes_the_first_accepted_tiling_and_launches_keep_it(mq):
    limits = _limits(mq, RTX_3090)
    candidates = mq.tq_mq_verify_candidates(4, 6, 256, 4, False, limits)
    refused = candidates[0]
    tiles, why = mq.tq_mq_verify_select(
        4, 6, 256, 4, False, limits, fits=lambda t: "too big" if t == refused else None, device_index=7)
    assert tiles == candidates[1] and len(why) == 1 and "too big" in why[0]
    try:
        assert mq._planned_tiles(torch.device("cuda", 7), 4, 6, 256, 4, False) == tiles
    finally:
        mq._TILES.clear()


@pytest.mark.parametrize("device", [H100, A100])
def test_32_row_tiles_of_4bit_keys_at_d256_take_32_tokens_a_step(mq, device):
    """At 32 x 64, 4-bit keys at D=256 spill 1.4-1.9 KB a thread on sm_80 and sm_90 (docs/gpu-fit-current-triton-3.8.md)
    and took 1.34-1.54x as long on the H100 as at 32 x 32: Qwen3.6-27B with MTP K=3 (K+1 = 4, 24 rows) starts at
    BLOCK_N 32 on CUDA; 16-row tiles (K+1 = 2) and ROCm (no such spill) keep 64."""
    limits = _limits(mq, device)
    [first, *_] = mq.tq_mq_verify_candidates(4, 6, 256, 4, False, limits)
    assert (first.block_m, first.block_n) == (32, 32)
    [first, *_] = mq.tq_mq_verify_candidates(2, 6, 256, 4, False, limits)
    assert (first.block_m, first.block_n) == (16, 64)
    [first, *_] = mq.tq_mq_verify_candidates(4, 6, 256, 4, False, _limits(mq, MI300X))
    assert (first.block_m, first.block_n) == (32, 64)
    # FP8 keys keep the widest step.
    [first, *_] = mq.tq_mq_verify_candidates(4, 6, 256, 0, True, limits)
    assert (first.block_m, first.block_n) == (32, 64)


@pytest.mark.parametrize(("preset", "device"), [("4bit_nc", RTX_3090), ("3bit_nc", RTX_3090), ("4bit_nc", T4),
                                                 ("k3v4_nc", MI300X)])
def test_kernel_at_the_tiles_a_smaller_part_gets_matches_reference(mq, preset, device):
    """Qwen3.6-27B's head geometry (G=6, D=256), K+1=4, 2 KV heads: the kernel with the first tiling the
    planner gives that device (narrower BLOCK_N, or narrower BLOCK_M over several M tiles, float32 scores on
    sm_75 and ROCm) against the float64 reference."""
    k1, group, hk, d, bs = 4, 6, 2, 256, 16
    tiles = mq.tq_mq_verify_candidates(k1, group, d, MSE[preset], False, _limits(mq, device))[0]
    lens = [2, bs + 3, 2 * bs + 1, 0]
    cache = build_tq_cache(preset, lens, hk, d, bs, DEVICE, seed=11)
    kv = cache.kv_cache.permute(0, 2, 1, 3).contiguous().transpose(1, 2)  # 0.33's storage, as forward hands it
    n = len(lens) * k1
    query = torch.randn(n, hk * group, d, generator=torch.Generator().manual_seed(5)).half().to(DEVICE)
    out = torch.full((n, hk * group, d), float("nan"), dtype=query.dtype, device=DEVICE)
    lse = torch.full((n, hk * group), float("nan"), device=DEVICE)
    mid = torch.empty(n, hk * group, 2, d + 1, device=DEVICE)
    q_rot = torch.empty(n, hk * group, d, device=DEVICE)
    lay = cache.layout
    mq.triton_turboquant_mq_verify_attention(
        query, kv, cache.block_table, cache.seq_lens, k1, cache.centroids, 1 / math.sqrt(d), lay.mse_bits,
        lay.key_packed_size, lay.value_bits, out, mid, q_rot, PiT=cache.pi, key_fp8=lay.key_fp8,
        norm_correction=lay.norm_correction, lse=lse, max_num_kv_splits=2, num_kv_splits=2, tiles=tiles,
        min_split_len=tiles.block_n)
    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, 1 / math.sqrt(d))
    live = torch.tensor(tq_verify_rows(lens, k1)[0]) > 0
    torch.testing.assert_close(out.float().cpu()[live], want.float().cpu()[live], atol=3e-3, rtol=1e-2)
    torch.testing.assert_close(lse.cpu()[live], want_lse.float().cpu()[live], atol=2e-3, rtol=1e-4)
    assert not bool(out.cpu()[~live].any()), "rows without a visible token must be 0"


# --- The backend's route -------------------------------------------------------------------------------------

HQ, HK = 24, 4


def _config(num_spec, max_num_seqs=8, max_num_batched_tokens=64, preset="4bit_nc"):
    return tq_harness.vllm_config(num_spec, HQ, max_num_seqs, 4, max_num_batched_tokens, dtype=torch.bfloat16,
                                  cache_dtype=f"turboquant_{preset}")  # _spec()'s preset


def _spec(preset="4bit_nc", head_size=256):
    return SimpleNamespace(num_kv_heads=HK, head_size=head_size, block_size=16,
                           kv_quant_mode=SimpleNamespace(name=f"TURBOQUANT_{preset.upper()}"))


@pytest.fixture
def on_a_gpu(mq, v033_tree, monkeypatch):
    """The backend of the patched tree with the real kernel module, on a stand-in CUDA device 0 whose limits
    are RTX_3090's and whose launches the test's probe decides."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    tq, _, _ = tq_harness.load(v033_tree, mq=mq)
    monkeypatch.setattr(tq, "tq_mq_device_limits", lambda device: mq.TQMQLimits(*RTX_3090))
    mq._TILES.clear()
    yield tq
    mq._TILES.clear()


def test_route_steps_aside_when_the_device_takes_no_tiling(mq, on_a_gpu, monkeypatch, caplog):
    tq = on_a_gpu
    probed = []

    def refuse(tiles, **kw):
        probed.append((tiles, kw["k1"], kw["group"]))
        return "OutOfResources: out of resource: shared memory"

    monkeypatch.setattr(tq, "tq_mq_verify_probe", refuse)
    builder = tq.TurboQuantAttentionBackend.get_builder_cls()
    cg = tq.AttentionCGSupport
    with caplog.at_level(logging.WARNING):
        assert builder.get_cudagraph_support(_config(3), _spec()) == cg.UNIFORM_SINGLE_TOKEN_DECODE
        assert builder(_spec(), ["l"], _config(3), "cpu").reorder_batch_threshold == 1
    assert probed and all(t.block_n >= 16 for t, _, _ in probed)
    assert {(k1, g) for _, k1, g in probed} == {(1, 6)}  # K+1=1 is decided first, and refused
    warnings = [r for r in caplog.records if "does not fit" in r.getMessage()]
    assert len(warnings) == 1 and "per-request" in warnings[0].getMessage()


def test_route_takes_the_tiles_the_device_accepts(mq, on_a_gpu, monkeypatch):
    tq = on_a_gpu
    widest_n = mq.tq_mq_verify_candidates(4, 6, 256, 4, False, mq.TQMQLimits(*H100))[0].block_n

    def accept_narrow(tiles, **kw):
        return None if tiles.block_n < widest_n else "needs 131072 B of shared memory"

    monkeypatch.setattr(tq, "tq_mq_verify_probe", accept_narrow)
    builder = tq.TurboQuantAttentionBackend.get_builder_cls()
    assert builder.get_cudagraph_support(_config(3), _spec()) == tq.AttentionCGSupport.UNIFORM_BATCH
    assert builder(_spec(), ["l"], _config(3), "cpu").reorder_batch_threshold == 4
    for k1 in (1, 4):
        tiles = mq._planned_tiles(torch.device("cuda", 0), k1, 6, 256, 4, False)
        assert tiles.block_n < widest_n


def test_environment_switch_keeps_the_release_route(mq, on_a_gpu, monkeypatch):
    tq = on_a_gpu
    monkeypatch.setattr(tq.envs, "VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode")
    monkeypatch.setattr(tq, "tq_mq_verify_probe", lambda tiles, **kw: None)
    builder = tq.TurboQuantAttentionBackend.get_builder_cls()
    assert builder.get_cudagraph_support(_config(3), _spec()) == tq.AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE


H100_SMS = 132


def _most_split_rows(k1s, max_reqs, max_rows, num_kv_heads, max_splits, num_sms=H100_SMS) -> int:
    """The most (query row, KV split) pairs a launch writes partials for, over every batch the scheduler can give
    the route (r requests of k1 rows, r * k1 within max_rows): by the launches' split rule, a launch of r x Hk
    programs (one M tile: a KV head's K+1 x G rows fit one tile here) takes enough KV splits for four programs
    per SM, at most max_splits, and one split writes no partials."""
    most = 0
    for k1 in k1s:
        for r in range(1, min(max_reqs, max_rows // k1) + 1):
            splits = min(max_splits, -(-4 * num_sms // (r * num_kv_heads)))
            if splits > 1:
                most = max(most, r * k1 * splits)
    return most


def _scratch_bytes(rows: int, split_rows: int, heads: int, head_dim: int, row_dtype: torch.dtype) -> int:
    """Bytes of one workspace allocation holding what the largest launches use, side by side, each part aligned
    to 256 bytes as vLLM's WorkspaceManager lays them out: float32 partials (max, sum and D values) of
    ``split_rows`` row-splits, the rows' rotated queries in float32, and the padded query and output rows of
    decodes of different lengths in the model's dtype."""
    parts = [split_rows * heads * (head_dim + 1) * 4, rows * heads * head_dim * 4,
             *[rows * heads * head_dim * row_dtype.itemsize] * 2]
    return sum(-(-part // 256) * 256 for part in parts)


def _scratch_calls(reserved, num_heads, head_size):
    """The multi-query kernel's reservations among the workspace calls: a flat float32 buffer of split
    partials and the rotated queries (rows, heads, D); with drafts also the query and output rows of decodes of
    different lengths (patch 0006), in the model's dtype."""
    return [shapes for shapes in reserved if len(shapes) in (2, 4) and len(shapes[0][0]) == 1
            and all(shape[1:] == (num_heads, head_size) for shape, _ in shapes[1:])]


@pytest.fixture
def workspace(monkeypatch):
    """A workspace manager that records what is reserved from it."""
    reserved = []

    class Workspace:
        def get_simultaneous(self, *shapes):
            reserved.append(shapes)

    def install(tq):
        monkeypatch.setattr(tq, "is_workspace_manager_initialized", lambda: True)
        monkeypatch.setattr(tq, "current_workspace_manager", Workspace)
        monkeypatch.setitem(tq.tq_mq_verify_split_rows.__globals__["_SM_COUNT"], 0, H100_SMS)
        return reserved

    return install


def test_workspace_covers_the_widest_layer_and_at_most_the_token_budget(mq, on_a_gpu, workspace, monkeypatch):
    """A drafter layer with 32 query heads beside the target's 24: the reservation takes 32; rows are
    min(max_num_seqs * (1 + K), max_num_batched_tokens); the split partials cover every launch the route can
    make and no more (small batches split, large ones do not), far below rows x the split limit."""
    tq = on_a_gpu
    reserved = workspace(tq)
    monkeypatch.setattr(tq, "tq_mq_verify_probe", lambda tiles, **kw: None)
    layers = {name: SimpleNamespace(impl=tq_harness.bare_impl(tq.TurboQuantAttentionImpl, hq, HK, 256))
              for name, hq in (("target", HQ), ("drafter", 32))}
    monkeypatch.setattr(tq, "get_layers_from_vllm_config", lambda config, cls, names=None: layers)
    builder = tq.TurboQuantAttentionBackend.get_builder_cls()
    max_reqs, max_tokens, splits = 32, 64, 16
    rows = 64  # min(32 * 4, 64)
    config = tq_harness.vllm_config(3, HQ, max_reqs, splits, max_tokens, dtype=torch.bfloat16,
                                    cache_dtype="turboquant_4bit_nc")
    builder(_spec(), ["target", "drafter"], config, "cpu")
    calls = _scratch_calls(reserved, 32, 256)
    assert len(calls) == 1, reserved
    (flat, flat_dtype), (rot, rot_dtype), *padded = calls[0]
    assert rot == (rows, 32, 256) and flat_dtype == rot_dtype == torch.float32
    assert padded == [((rows, 32, 256), torch.bfloat16)] * 2
    need = _most_split_rows((1, 4), max_reqs, max_tokens, HK, splits)
    assert 0 < need < rows * splits
    assert flat[0] == need * 32 * 257
    # At vLLM's defaults (256 sequences, 8192 tokens, 32 splits) a sixteenth of rows x the split limit.
    assert _most_split_rows((1, 4), 256, 8192, HK, 32) * 16 < 1024 * 32


def test_layers_reserve_their_scratch_when_built(mq, v033_tree, monkeypatch):
    """Each TurboQuant attention layer reserves its kernel scratch in its constructor, while the model is
    built and before vLLM's memory profile ends, so the KV cache is sized without those bytes (the builders,
    which reserve it too, are made after the profile). At vLLM's defaults (256 sequences, 8192 batched tokens,
    32 KV splits) with MTP K = 3 on an H100 (132 SMs), Qwen3.6-27B's 24/4 heads of 256 in bfloat16: the tree's
    WorkspaceManager, locked after the constructor as vLLM locks it after the profile, holds exactly the bytes of
    1024 rows (256 x 4) and of the most split rows any launch takes, and not one byte more.
    VLLM_TURBOQUANT_ATTENTION_KERNEL=decode, which turns the kernel off, reserves nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    if not torch.accelerator.is_available():
        monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)  # no device cache to release
    config = tq_harness.vllm_config(3, HQ, 256, 32, 8192, dtype=torch.bfloat16, cache_dtype="turboquant_4bit_nc")
    tq = tq_harness.load_backend(v033_tree, config)
    monkeypatch.setitem(tq.tq_mq_verify_split_rows.__globals__["_SM_COUNT"], 0, H100_SMS)
    manager = tq_harness.workspace_manager(v033_tree)
    monkeypatch.setattr(tq, "is_workspace_manager_initialized", lambda: True)
    monkeypatch.setattr(tq, "current_workspace_manager", lambda: manager)
    # The decode kernel's and the continuation prefill's sets (test_tq_workspace_profiled.py) aside.
    monkeypatch.setattr(tq, "_reserve_decode_scratch", lambda *a, **k: None, raising=False)
    tq.TurboQuantAttentionImpl(HQ, 256, 1 / 16, num_kv_heads=HK, kv_cache_dtype="turboquant_4bit_nc")
    manager.lock()
    rows = min(256 * 4, 8192)
    want = _scratch_bytes(rows, _most_split_rows((1, 4), 256, 8192, HK, 32), HQ, 256, torch.bfloat16)
    manager.get_simultaneous(((want,), torch.uint8))  # held: no growth
    with pytest.raises(AssertionError, match="locked"):
        manager.get_simultaneous(((want + 1,), torch.uint8))

    monkeypatch.setenv("VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode")
    manager = tq_harness.workspace_manager(v033_tree)
    monkeypatch.setattr(tq, "current_workspace_manager", lambda: manager)
    tq.TurboQuantAttentionImpl(HQ, 256, 1 / 16, num_kv_heads=HK, kv_cache_dtype="turboquant_4bit_nc")
    manager.lock()
    with pytest.raises(AssertionError, match="locked"):
        manager.get_simultaneous(((1,), torch.uint8))


def test_a_flat_scratch_gives_the_same_result(mq):
    """The launch views a flat float32 scratch (what the workspace reserves) as its [rows, heads, splits,
    D + 1] partials: the same output and LSE as with the shaped buffer, bit for bit, through the reduce step
    over 3 splits."""
    k1, group, hk, d, bs = 4, 2, 2, 64, 16
    lens = [2, 2 * bs + 5, 3 * bs]
    cache = build_tq_cache("4bit_nc", lens, hk, d, bs, DEVICE, seed=3)
    kv = cache.kv_cache.permute(0, 2, 1, 3).contiguous().transpose(1, 2)
    n, hq = len(lens) * k1, hk * group
    query = torch.randn(n, hq, d, generator=torch.Generator().manual_seed(2)).half().to(DEVICE)
    lay = cache.layout
    results = []
    for mid in (torch.full((n, hq, 3, d + 1), float("nan"), device=DEVICE),
                torch.full((n * hq * 3 * (d + 1) + 5,), float("nan"), device=DEVICE)):
        out = torch.full((n, hq, d), float("nan"), dtype=query.dtype, device=DEVICE)
        lse = torch.full((n, hq), float("nan"), device=DEVICE)
        mq.triton_turboquant_mq_verify_attention(
            query, kv, cache.block_table, cache.seq_lens, k1, cache.centroids, 1 / math.sqrt(d), lay.mse_bits,
            lay.key_packed_size, lay.value_bits, out, mid, torch.empty(n, hq, d, device=DEVICE), PiT=cache.pi,
            key_fp8=lay.key_fp8, norm_correction=lay.norm_correction, lse=lse, max_num_kv_splits=3,
            num_kv_splits=3, min_split_len=bs)
        results.append((out, lse))
    (out, lse), (flat_out, flat_lse) = results
    assert not out.isnan().any()
    assert torch.equal(out, flat_out) and torch.equal(lse, flat_lse)
    with pytest.raises(ValueError, match="flat mid_o_buf"):
        mq.triton_turboquant_mq_verify_attention(
            query, kv, cache.block_table, cache.seq_lens, k1, cache.centroids, 1 / math.sqrt(d), lay.mse_bits,
            lay.key_packed_size, lay.value_bits, out, torch.empty(n * hq * 3 * (d + 1) - 1, device=DEVICE),
            torch.empty(n, hq, d, device=DEVICE), PiT=cache.pi, lse=lse, max_num_kv_splits=3, num_kv_splits=3)


def test_query_rotation_fits_the_smaller_parts(mq):
    """The rotation of MSE queries stages a 32 x D query tile and a D x 64 tile of PiT in float32: 96 KiB at
    D 256, over sm_75's 64 KiB (its compiled kernel needs 98304 B there). Its tiles shrink with the limit; the
    tiles of the verify kernel carry them, and the probe launches the rotation too."""
    for device, want in ((H100, (32, 64)), (RTX_3090, (32, 64)), (T4, (32, 16)), (MI300X, (32, 16))):
        limits = _limits(mq, device)
        rows, cols = mq.tq_mq_rotate_tiles(256, limits)
        assert (rows, cols) == want and 4 * 256 * (rows + cols) <= device[0]
        for tiles in mq.tq_mq_verify_candidates(4, 6, 256, 4, False, limits):
            assert (tiles.rotate_rows, tiles.rotate_cols) == want
    assert mq.tq_mq_rotate_tiles(128, _limits(mq, T4)) == (32, 64)


def _route_with_host_probes(mq, tq, monkeypatch, limits, preset: str, fits=None, num_spec: int = 3):
    """Decide tq's route for Qwen3.6-27B (24/4 heads of 256), ``num_spec`` drafts (MTP K=3), ``preset`` on a
    stand-in CUDA device with ``limits``, the route's probes running the real ``tq_mq_verify_probe`` on the host
    with every argument the route passes (only the device is the host's); ``fits(tiles, launches)`` judges the
    launches a probe made (None: accepted). Returns whether the route took the kernel."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(mq, "tq_mq_device_limits", lambda device=None: limits)
    monkeypatch.setattr(tq, "tq_mq_device_limits", lambda device=None: limits)
    recorder = mq._tq_mq_verify_fwd.recorder

    def probe_on_the_host(tiles, **kw):
        start = len(recorder.launches)
        why_not = mq.tq_mq_verify_probe(tiles, **{**kw, "device": torch.device("cpu")})
        return why_not if why_not or fits is None else fits(tiles, recorder.launches[start:])

    monkeypatch.setattr(tq, "tq_mq_verify_probe", probe_on_the_host)
    builder = tq.TurboQuantAttentionBackend.get_builder_cls()
    config = _config(num_spec, preset=preset)
    return builder.get_cudagraph_support(config, _spec(preset)) == tq.AttentionCGSupport.UNIFORM_BATCH


def _layer_cache(preset: str, num_blocks: int, block_size: int = 16, pad: int = 0) -> torch.Tensor:
    """A layer's cache as forward passes it to the kernel: (blocks, KV heads, block_size, slot) bytes seen through
    transpose(1, 2); ``pad`` bytes after each block, as vLLM leaves them when a hybrid model's pages are padded to
    the GDN state's page size (the kernel then sees another block stride and, with a kernel block size other than
    the spec's, another block size)."""
    slot = references.TQLayout.from_preset(f"turboquant_{preset}", 256).slot_size_aligned
    page = HK * block_size * slot + pad
    raw = torch.zeros(num_blocks * page, dtype=torch.uint8)
    return raw.as_strided((num_blocks, HK, block_size, slot), (page, block_size * slot, slot, 1)).transpose(1, 2)


def _warm(mq, preset: str, cache: torch.Tensor, k1s, monkeypatch) -> None:
    """What the layer does at its first call outside a capture (patch 0003: tq_mq_verify_warm), its launches
    planned for the stand-in CUDA device 0 (the host's tensors would plan for no device)."""
    lay = references.TQLayout.from_preset(f"turboquant_{preset}", 256)
    planned = mq._planned_tiles
    monkeypatch.setattr(mq, "_planned_tiles", lambda device, *a: planned(torch.device("cuda", 0), *a))
    mq.tq_mq_verify_warm(cache, k1s, HQ, 256, torch.zeros(16), torch.zeros(256, 256), torch.bfloat16,
                         mse_bits=lay.mse_bits, key_packed_size=lay.key_packed_size, value_bits=lay.value_bits,
                         key_fp8=lay.key_fp8, norm_correction=lay.norm_correction, max_num_kv_splits=32)


def _block_table(num_reqs: int, max_num_seqs: int = 256, max_model_len: int = 4096, block_size: int = 16):
    """The block table as the layer gets it: the first num_reqs rows of the scheduler's (max_num_seqs,
    cdiv(max_model_len, block_size)) table, so its row stride is the model's blocks per request, whatever the
    batch (the route's probes and the layer's first-call compile use one-row tables of their own)."""
    table = torch.zeros(max_num_seqs, -(-max_model_len // block_size), dtype=torch.int32)
    table[:num_reqs, 0] = torch.arange(num_reqs, dtype=torch.int32)
    return table[:num_reqs]


def _serve(mq, preset: str, k1: int, num_reqs: int, num_sms: int = H100_SMS, max_splits: int = 32,
           cache: torch.Tensor | None = None) -> None:
    """One launch as the layer makes it on a GPU of num_sms SMs (_multi_query_attention): num_reqs requests of k1
    queries, the cache in the layer's layout (``_layer_cache``), flat split partials and the rotated queries from
    the workspace, the tiles the route chose for this device (``_planned_tiles``) and the launcher's split rule
    for num_sms SMs (the host has none)."""
    lay = references.TQLayout.from_preset(f"turboquant_{preset}", 256)
    group, rows = HQ // HK, num_reqs * k1
    tiles = mq._planned_tiles(torch.device("cuda", 0), k1, group, 256, lay.mse_bits, lay.key_fp8)
    splits = mq.tq_mq_verify_num_splits(num_reqs * HK * tiles.m_tiles, num_sms, max_splits)
    mq.triton_turboquant_mq_verify_attention(
        torch.zeros(rows, HQ, 256, dtype=torch.bfloat16),
        _layer_cache(preset, num_reqs) if cache is None else cache,
        _block_table(num_reqs), torch.full((num_reqs,), k1, dtype=torch.int32), k1,
        torch.zeros(16), 0.0625, lay.mse_bits, lay.key_packed_size, lay.value_bits,
        torch.empty(rows, HQ, 256, dtype=torch.bfloat16), torch.empty(rows * max_splits * HQ * 257),
        torch.empty(rows, HQ, 256), PiT=torch.zeros(256, 256), key_fp8=lay.key_fp8,
        norm_correction=lay.norm_correction, max_num_kv_splits=max_splits, num_kv_splits=splits, tiles=tiles)


@pytest.mark.parametrize(("preset", "num_spec", "hybrid"), [("k8v4", 3, False), ("4bit_nc", 3, False),
                                                        ("3bit_nc", 3, False), ("3bit_nc", 0, False),
                                                        ("4bit_nc", 3, True), ("k8v4", 1, True)])
def test_serving_compiles_no_kernel_variant_the_route_did_not_probe(mq, on_a_gpu, monkeypatch, preset, num_spec,
                                                                   hybrid):
    """Every batch serving can send (K+1 from 1 to 1 + K: uniform batches of shorter drafts take their own
    length; 1 to 16 requests, so every split count the launcher takes on an H100) launches only kernel variants
    the route's probes launched before the first capture: Triton's binder gives each launch its compile key
    (launch_keys.py) and serving adds none. A variant first launched while serving compiles then (seconds, and an
    error under vLLM's JIT monitor in error mode); the split count and the partials' strides are kept out of the
    key, K+1 and the preset's norm correction are probed. Without drafts (K+1 = 1 only) too.

    A hybrid model's cache has a kernel block size other than the spec's the route probes (32 for 16) and padded
    pages (another block stride): Triton specializes on both, so the layer's first call launches every variant on
    its own cache (``tq_mq_verify_warm``) before serving; those launches count with the probes'."""
    recorder = launch_keys.record_launches(mq, monkeypatch)
    assert _route_with_host_probes(mq, on_a_gpu, monkeypatch, mq.TQMQLimits(*RTX_3090), preset, num_spec=num_spec)
    cache = _layer_cache(preset, 16, block_size=32, pad=48) if hybrid else _layer_cache(preset, 16)
    _warm(mq, preset, cache, range(1, num_spec + 2), monkeypatch)
    probed = recorder.keys()
    recorder.launches.clear()
    for k1 in range(1, num_spec + 2):
        for num_reqs in range(1, 17):
            _serve(mq, preset, k1, num_reqs, cache=cache)
    served = recorder.keys()
    assert len({launch.kernel for launch in served}) == (2 if preset == "k8v4" else 3)
    new = served - probed
    example = min(new, key=repr) if new else None
    assert not new, f"{len(new)} of {len(served)} variants serving launches were never probed, e.g. {example}"


@pytest.mark.parametrize(("preset", "max_model_len"), [("k8v4", 4096), ("4bit_nc", 4100), ("3bit_nc", 4100)])
def test_a_continuation_chunk_compiles_no_decode_variant_the_first_call_did_not(mq, on_a_gpu, v033_tree, monkeypatch,
                                                                              caplog, preset, max_model_len):
    """A prompt's continuation chunk of at most 128 tokens over its cached part (a chunked prompt, a prefix-cache
    hit) runs the release's decode kernels, one query per row, from ``_prefill_attention``. The release's verify
    batches take the same path, so its graph capture compiles them; the line's take the multi-query kernel, so
    the layer's first call (``_compile_multi_query_variants``, inside the capture) compiles them without a launch.
    Every chunk of 1 to 64 tokens, in rows of the scheduler's block table whose starts are 16-byte aligned or not
    (257 blocks a request at 4100 tokens), launches only variants that call compiled (Triton's binder,
    launch_keys.py): otherwise each compiles at the first such chunk while serving, under vLLM's JIT monitor."""
    decode = vllm_tree.load_module(v033_tree, DECODE)
    tq = tq_harness.load_backend(v033_tree)
    assert tq.triton_turboquant_decode_attention.__globals__ is decode.__dict__
    recorder = launch_keys.record_launches(mq, monkeypatch)
    assert _route_with_host_probes(mq, on_a_gpu, monkeypatch, mq.TQMQLimits(*RTX_3090), preset)
    launch_keys.record_launches(decode, monkeypatch, kernels=launch_keys.DECODE_KERNELS, recorder=recorder)
    planned = mq._planned_tiles
    monkeypatch.setattr(mq, "_planned_tiles", lambda device, *a: planned(torch.device("cuda", 0), *a))
    lay = references.TQLayout.from_preset(f"turboquant_{preset}", 256)
    impl = tq_harness.bare_impl(tq.TurboQuantAttentionImpl, HQ, HK, 256)
    impl.tq_config = SimpleNamespace(key_mse_bits=lay.mse_bits, key_packed_size=lay.key_packed_size,
                                     effective_value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8,
                                     norm_correction=lay.norm_correction, value_packed_size=None)
    impl.max_num_kv_splits = 32
    cache, table = _layer_cache(preset, 64), _block_table(4, max_model_len=max_model_len)
    pit, centroids = torch.eye(256), torch.zeros(16)
    # The layer's first call, given the batch's block table where the call compiles the continuation's variants.
    first_call = impl._compile_multi_query_variants
    given_table = (table,) if "block_table" in inspect.signature(first_call).parameters else ()
    with caplog.at_level(logging.WARNING):
        first_call(cache, *given_table, centroids, pit, torch.bfloat16)
    assert "compiled ahead" not in caplog.text
    compiled = recorder.keys()
    recorder.launches.clear()

    cached = 100
    for chunk in (1, 2, 7, 64):
        q_lens = [chunk] * 4
        qsl = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
        seq_lens = torch.tensor([cached + q for q in q_lens], dtype=torch.int32)
        n = int(qsl[-1])
        meta = tq.TurboQuantMetadata(seq_lens=seq_lens, slot_mapping=torch.zeros(n, dtype=torch.int64),
                                     block_table=table, query_start_loc=qsl, num_actual_tokens=n,
                                     max_query_len=chunk, max_seq_len=int(seq_lens.max()), is_prefill=True,
                                     query_start_loc_cpu=qsl.clone(), seq_lens_cpu=seq_lens.clone())
        query = torch.zeros(n, HQ, 256, dtype=torch.bfloat16)
        kv = torch.zeros(n, HK, 256, dtype=torch.bfloat16)
        impl._prefill_attention(query, kv, kv, cache, meta, pit, centroids, pit, layer=SimpleNamespace())
    served = recorder.keys()
    assert {launch.kernel for launch in served} == set(launch_keys.DECODE_KERNELS)
    # One query: the row's own stride (257: not a multiple of 16); more: 0. Rows start aligned or not at 257.
    assert len({launch for launch in served if launch.kernel == "_tq_decode_stage1"}) == (1 if max_model_len % 64
                                                                                           == 0 else 4)
    new = served - compiled
    example = min(new, key=repr) if new else None
    assert not new, f"{len(new)} of {len(served)} variants continuation chunks launch were not compiled, e.g. {example}"


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["k8v4", "4bit_nc", "3bit_nc"])
def test_every_variant_the_route_launches_compiles_for_sm75(mq, on_a_gpu, monkeypatch, v033_tree, preset):
    """On sm_75 (T4, RTX 20xx: 64 KiB of shared memory per block, float32 scores) the route, its probes compiled
    ahead of time for sm_75 (launch_keys.compile_launches: what each probe launched, compiled as Triton's JIT
    would compile it there, refused on a compile error or over 65536 B), takes tiles for every K+1 it can launch;
    then every launch serving makes at K+1 = 1..4 compiles for sm_75 within the limit. A launch at a K+1 the route
    did not probe takes the widest tiling the shared-memory estimate allows, which the compiled kernel can
    exceed (OutOfResources in the middle of serving)."""
    kernel_file = v033_tree / VERIFY
    t4 = mq.TQMQLimits(*T4)

    def fits_sm75(tiles, launches):
        for res in launch_keys.compile_launches(kernel_file, "sm_75", launches):
            if "error" in res:
                return res["error"]
            if res["shared"] > t4.max_shared:
                return f"needs {res['shared']} B of shared memory, the limit is {t4.max_shared} B"
        return None

    recorder = launch_keys.record_launches(mq, monkeypatch, capability=75)
    if not _route_with_host_probes(mq, on_a_gpu, monkeypatch, t4, preset, fits_sm75):
        pytest.fail(f"no tiling of {preset} fits sm_75")
    recorder.launches.clear()
    for k1 in range(1, 5):
        for num_reqs in (1, 64):  # split, unsplit
            _serve(mq, preset, k1, num_reqs, num_sms=40)  # a T4's 40 SMs
    launches = sorted(recorder.keys(), key=repr)
    results = launch_keys.compile_launches(kernel_file, "sm_75", launches)
    bad = [(launch.kernel, res.get("error") or res["shared"]) for launch, res in zip(launches, results, strict=True)
           if "error" in res or res["shared"] > t4.max_shared]
    assert not bad, bad

