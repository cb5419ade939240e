"""vLLM's TurboQuant Triton kernels (KV store, fused decode attention) against ``references``.

The decode tests read a paged cache whose K/V the reference dequantizes from the very same bytes, so
the quantization is shared and the comparison is of the attention itself: paging through the block
table, GQA head mapping, the length mask, split-KV softmax and its merge, the unpacking of each preset.
"""

from __future__ import annotations

import pytest
import torch

from references import TQ_PRESETS, TQLayout, build_tq_cache, dequantize_tq, tq_attention_ref, unpack_bits
from vllm_tree import interpreted, load_module

pytestmark = pytest.mark.kernels

DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
STORE = "vllm/v1/attention/ops/triton_turboquant_store.py"
CENTROIDS = "vllm/model_executor/layers/quantization/turboquant/centroids.py"
CONFIG = "vllm/model_executor/layers/quantization/turboquant/config.py"

# The kernel and the float64 reference read the same dequantized K/V, so they differ only by float32
# rounding (the kernel's online softmax, its rotated-basis dot products) when the query is float32; a
# float16 query also gets a float16 output (11-bit mantissa, |out| below about 3). One position too
# many or too few moves outputs by about 1e-2, far above both bounds.
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=5e-3, rtol=5e-3)}


@pytest.fixture(params=["pristine", "patched"])
def tree(request, pristine_tree, patched_tree):
    return pristine_tree if request.param == "pristine" else patched_tree


def centroids_for(tree, layout: TQLayout) -> torch.Tensor:
    """The Lloyd-Max table the vLLM attention layer registers for this preset."""
    return load_module(tree, CENTROIDS).get_centroids(layout.head_dim, layout.centroid_bits)


def decode(tree, query, cache, seq_lens=None, block_table=None, **kwargs) -> torch.Tensor:
    mod = load_module(tree, DECODE)
    d = query.shape[-1]
    return mod.triton_turboquant_decode_attention(
        query, cache.kv_cache, cache.block_table if block_table is None else block_table,
        cache.seq_lens if seq_lens is None else seq_lens, scale=d**-0.5, **cache.decode_kwargs, **kwargs)


@pytest.mark.parametrize("preset", sorted(TQ_PRESETS))
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_slot_layout_matches_vllm_config(pristine_tree, preset, head_dim):
    """The reference packer's slot layout is vLLM's (so a cache it packs is what the store would write)."""
    cfg = load_module(pristine_tree, CONFIG).TurboQuantConfig.from_cache_dtype(preset, head_dim)
    lay = TQLayout.from_preset(preset, head_dim)
    assert (lay.key_fp8, lay.mse_bits, lay.value_bits, lay.norm_correction) == \
        (cfg.key_fp8, cfg.key_mse_bits, cfg.effective_value_quant_bits, cfg.norm_correction)
    assert (lay.key_packed_size, lay.slot_size, lay.slot_size_aligned, lay.centroid_bits) == \
        (cfg.key_packed_size, cfg.slot_size, cfg.slot_size_aligned, cfg.centroid_bits)


@pytest.mark.parametrize("preset", sorted(TQ_PRESETS))
def test_store_kernel_writes_the_reference_packing(tree, device, preset):
    """vLLM's store kernel fills the slots as ``references.quantize_tq`` does: the same quantization
    indices (an index may differ by one where float32 rounding lands on a bucket edge), fp16 norm,
    scale and zero within one fp16 ulp."""
    d, hk = 64, 2
    lay = TQLayout.from_preset(preset, d)
    lens = [13, 6]
    args = dict(num_kv_heads=hk, head_dim=d, block_size=8, device=device, seed=5,
                centroids=centroids_for(tree, lay))
    mine = build_tq_cache(preset, lens, **args)
    theirs = build_tq_cache(preset, lens, store=load_module(tree, STORE).triton_turboquant_store, **args)
    assert torch.equal(mine.block_table, theirs.block_table)
    for b in range(len(lens)):
        a = mine.read_request(b).flatten(0, 1)
        t = theirs.read_request(b).flatten(0, 1)
        if lay.key_fp8:
            if not interpreted():
                ka, kt = dequantize_tq(a, lay, mine.centroids, mine.pi, mine.fp8_e4b15)[0], \
                    dequantize_tq(t, lay, mine.centroids, mine.pi, mine.fp8_e4b15)[0]
                # Both round to nearest even; allow one fp8 step (2**-3 relative) on a rare element.
                assert (ka == kt).float().mean() >= 0.99
                torch.testing.assert_close(kt, ka, atol=2e-3, rtol=0.125)
            # else: the interpreter's float16 -> fp8 conversion drops the carry when rounding up crosses
            # a power of two (0.49 becomes 0.25), so FP8 key bytes are compared on a GPU only.
        else:
            ia = unpack_bits(a[:, : lay.mse_bytes], lay.key_bits, d)
            it = unpack_bits(t[:, : lay.mse_bytes], lay.key_bits, d)
            assert (ia == it).float().mean() >= 0.99 and (ia - it).abs().max() <= 1
            na = a[:, lay.mse_bytes: lay.mse_bytes + 2].contiguous().view(torch.float16).float()
            nt = t[:, lay.mse_bytes: lay.mse_bytes + 2].contiguous().view(torch.float16).float()
            torch.testing.assert_close(nt, na, atol=0, rtol=1e-3)
        base = lay.key_packed_size
        va = unpack_bits(a[:, base: base + lay.value_data_bytes], lay.value_bits, d)
        vt = unpack_bits(t[:, base: base + lay.value_data_bytes], lay.value_bits, d)
        assert (va == vt).float().mean() >= 0.99 and (va - vt).abs().max() <= 1
        base += lay.value_data_bytes
        sa = a[:, base: base + 4].contiguous().view(torch.float16).float()
        st = t[:, base: base + 4].contiguous().view(torch.float16).float()
        torch.testing.assert_close(st, sa, atol=0, rtol=1e-3)


def _decode_cases():
    # preset, block size, (Hq, Hk), seq lens, kv splits (None: the launcher's default, 32), query dtype
    cpu = [
        ("turboquant_k8v4", 8, (4, 2), [5, 19, 9], 4, torch.float32),
        ("turboquant_4bit_nc", 16, (4, 1), [1, 17, 33], 4, torch.float16),
        ("turboquant_k3v4_nc", 8, (6, 2), [12, 3, 24], 4, torch.float32),
        ("turboquant_3bit_nc", 16, (4, 2), [16, 7, 26], 4, torch.float16),
        ("turboquant_4bit_nc", 8, (2, 2), [2, 9], None, torch.float32),
    ]
    long_lens = [1, 15, 16, 17, 255, 513, 1000, 2047]
    gpu = [(preset, bs, heads, long_lens, None, torch.float16)
           for preset in sorted(TQ_PRESETS) for bs in (16, 64) for heads in ((32, 8), (8, 1))]
    gpu += [(preset, 32, (12, 4), long_lens, 8, torch.float32) for preset in sorted(TQ_PRESETS)]
    for case in cpu:
        yield pytest.param(*case, id=f"{case[0][11:]}-bs{case[1]}-gqa{case[2][0] // case[2][1]}")
    slow = pytest.mark.skipif(not torch.cuda.is_available(),
                              reason="large case: too slow under the Triton interpreter; runs on the GPU host "
                                     "(gpu/host.sh kernels)")
    for case in gpu:
        yield pytest.param(*case, id=f"gpu-{case[0][11:]}-bs{case[1]}-h{case[2][0]}x{case[2][1]}-s{case[4]}-"
                                     f"{str(case[5])[6:]}", marks=slow)


@pytest.mark.parametrize(("preset", "block_size", "heads", "lens", "splits", "qdtype"), list(_decode_cases()))
def test_decode_matches_reference(tree, device, preset, block_size, heads, lens, splits, qdtype):
    hq, hk = heads
    d = 64 if device == "cpu" else 128
    lay = TQLayout.from_preset(preset, d)
    cache = build_tq_cache(preset, lens, hk, d, block_size, device, seed=len(lens) + block_size,
                           centroids=centroids_for(tree, lay))
    gen = torch.Generator().manual_seed(11)
    query = torch.randn(len(lens), hq, d, generator=gen).to(device=device, dtype=qdtype)
    kwargs = {} if splits is None else dict(max_num_kv_splits=splits)

    out = decode(tree, query, cache, **kwargs)
    want = tq_attention_ref(query, cache.keys, cache.values, cache.seq_lens, d**-0.5)

    assert out.shape == query.shape and out.dtype == qdtype
    torch.testing.assert_close(out.float(), want, **TOL[qdtype])


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_3bit_nc"])
def test_decode_after_store_kernel(tree, device, preset):
    """Store then decode, both vLLM's kernels; the reference reads the bytes the store wrote."""
    d, hq, hk = 64, 4, 2
    lay = TQLayout.from_preset(preset, d)
    lens = [11, 4, 21]
    cache = build_tq_cache(preset, lens, hk, d, 8, device, seed=3, centroids=centroids_for(tree, lay),
                           store=load_module(tree, STORE).triton_turboquant_store)
    query = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(4)).to(device)

    out = decode(tree, query, cache, max_num_kv_splits=4)
    want = tq_attention_ref(query, cache.keys, cache.values, cache.seq_lens, d**-0.5)

    torch.testing.assert_close(out, want, **TOL[torch.float32])
    # The stored values are the originals to within half a quantization step (plus fp16 rounding of
    # scale and zero): the store wrote where the block table says, and the reference read it back.
    for raw, deq in zip(cache.raw_values, cache.values, strict=True):
        raw = raw.float()
        half_step = (raw.amax(-1, keepdim=True) - raw.amin(-1, keepdim=True)) / (2**lay.value_bits - 1) / 2
        assert ((raw - deq).abs() <= half_step * 1.01 + 1e-2).all()


def test_decode_rows_sharing_a_request(tree, device):
    """Query rows of one request with growing lengths over a repeated block-table row: the layout of
    v0.20's continuation fast path (and of K+1 speculative verification)."""
    d, hq, hk, k1 = 64, 4, 2, 3
    preset = "turboquant_4bit_nc"
    lens = [10, 18]
    cache = build_tq_cache(preset, lens, hk, d, 8, device, seed=9,
                           centroids=centroids_for(tree, TQLayout.from_preset(preset, d)))
    rows_request = torch.arange(len(lens), device=device).repeat_interleave(k1)
    offs = torch.arange(k1, device=device)
    synth = (cache.seq_lens[:, None] - k1 + 1 + offs).reshape(-1).to(torch.int32)
    table = cache.block_table.repeat_interleave(k1, dim=0)
    query = torch.randn(len(lens) * k1, hq, d, generator=torch.Generator().manual_seed(2)).to(device)

    out = decode(tree, query, cache, seq_lens=synth, block_table=table, max_num_kv_splits=4)
    want = tq_attention_ref(query, cache.keys, cache.values, synth, d**-0.5, rows_request=rows_request)

    torch.testing.assert_close(out, want, **TOL[torch.float32])
    # Each row saw its own prefix: consecutive rows of a request differ.
    assert not torch.allclose(out[0], out[1])


def test_decode_into_preallocated_buffers(tree, device):
    """Buffers larger than the batch, as the backend keeps them: results land in the output buffer."""
    d, hq, hk, splits = 64, 4, 2, 4
    preset = "turboquant_k3v4_nc"
    lens = [6, 14]
    cache = build_tq_cache(preset, lens, hk, d, 16, device, seed=1,
                           centroids=centroids_for(tree, TQLayout.from_preset(preset, d)))
    query = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(8)).to(device)
    rows = 5
    mid_o = torch.full((rows, hq, splits, d + 1), float("nan"), device=device)
    output = torch.full((rows, hq, d), float("nan"), device=device)
    lse = torch.full((rows, hq), float("nan"), device=device)

    out = decode(tree, query, cache, max_num_kv_splits=splits, mid_o_buf=mid_o, output_buf=output, lse_buf=lse)
    want = tq_attention_ref(query, cache.keys, cache.values, cache.seq_lens, d**-0.5)

    torch.testing.assert_close(out, want, **TOL[torch.float32])
    torch.testing.assert_close(output[: len(lens)], want, **TOL[torch.float32])
    assert torch.isnan(output[len(lens):]).all()
    assert torch.isfinite(lse[: len(lens)]).all()
