"""The roofline benchmark's references read what they claim: ``_stream_slots`` XORs every word of every slot a
split owns (and no other), ``_dequant_tiles`` sums the keys and values the verify kernel would dequantize. Run
on CPU under Triton's interpreter (or on a GPU) against PyTorch over a shuffled paged cache."""

from __future__ import annotations

import math

import bench_tq_mq_roofline as roof
import pytest
import torch
from bench_tq_mq_verify import random_cache

from references import TQLayout, gaussian_centroids

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK_N, PAGE, SPLITS, MIN_SPLIT = 16, 16, 3, 16


def _case(preset: str, head_major: bool, d: int = 32, reqs: int = 2, ctx: int = 70, hk: int = 2):
    lay = TQLayout.from_preset(preset, d)
    kv, table, seq_lens = random_cache(lay, reqs, ctx, hk, PAGE, DEVICE, seed=7)
    if head_major:  # vLLM's (blocks, Hk, block_size, slot) memory, seen through transpose(1, 2)
        kv = kv.transpose(1, 2).contiguous().transpose(1, 2)
    seq_lens = torch.tensor([ctx, ctx - 23], dtype=torch.int32, device=DEVICE)[:reqs]
    return lay, kv, table, seq_lens


def _split_tokens(seq_len: int) -> list[range]:
    per = max(math.ceil(seq_len / SPLITS), MIN_SPLIT)
    per = math.ceil(per / BLOCK_N) * BLOCK_N
    return [range(s * per, min((s + 1) * per, seq_len)) for s in range(SPLITS)]


def _slots(kv, table, req, head, tokens):
    """[tokens, slot bytes] of one request and head, through the block table."""
    rows = [kv[int(table[req, t // PAGE]), t % PAGE, head] for t in tokens]
    return torch.stack(rows) if rows else kv.new_zeros(0, kv.shape[-1])


@pytest.mark.parametrize("head_major", [True, False])
@pytest.mark.parametrize("preset", ["k8v4", "4bit_nc"])
def test_stream_xors_every_word_of_the_splits_slots(preset, head_major):
    lay, kv, table, seq_lens = _case(preset, head_major)
    reqs, hk = table.shape[0], kv.shape[2]
    align = math.gcd(kv.stride(0), kv.stride(1), kv.stride(2), 4)
    ty = {4: torch.int32, 2: torch.int16}.get(align, torch.uint8)
    words = kv.view(ty)
    wslot = lay.slot_size_aligned // words.element_size()
    sink = torch.zeros(reqs * hk * SPLITS, dtype=torch.int32, device=DEVICE)
    es = words.element_size()
    roof._stream_slots[(reqs, hk, SPLITS)](
        words, table, seq_lens, sink, kv.stride(0) // es, kv.stride(1) // es, kv.stride(2) // es, table.stride(0),
        WORDS=wslot, WORDS_P2=1 << (wslot - 1).bit_length(), BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE, NUM_SPLITS=SPLITS,
        MIN_SPLIT=MIN_SPLIT)
    want = torch.zeros(reqs, hk, SPLITS, dtype=torch.int64)
    for r, h in [(r, h) for r in range(reqs) for h in range(hk)]:
        for s, tokens in enumerate(_split_tokens(int(seq_lens[r]))):
            x = 0
            for w in _slots(kv, table, r, h, tokens).contiguous().view(ty).reshape(-1).tolist():
                x ^= w
            want[r, h, s] = x
    assert torch.equal(sink.view(reqs, hk, SPLITS).cpu().to(torch.int64), want)


@pytest.mark.parametrize("head_major", [True, False])
@pytest.mark.parametrize("preset", ["k8v4", "4bit_nc"])
def test_dequant_sums_the_kernels_keys_and_values(preset, head_major):
    lay, kv, table, seq_lens = _case(preset, head_major)
    d, reqs, hk = lay.head_dim, table.shape[0], kv.shape[2]
    centroids = gaussian_centroids(d, lay.centroid_bits).to(DEVICE)
    fp8_e4b15 = 1 if DEVICE == "cuda" and torch.cuda.get_device_capability() < (8, 9) else 0
    sink = torch.zeros(reqs * hk * SPLITS, dtype=torch.float32, device=DEVICE)
    roof._dequant_tiles[(reqs, hk, SPLITS)](
        kv, table, seq_lens, centroids, sink, kv.stride(0), kv.stride(1), kv.stride(2), table.stride(0),
        HEAD_DIM=d, BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE, NUM_SPLITS=SPLITS, MIN_SPLIT=MIN_SPLIT,
        KEY_FP8=1 if lay.key_fp8 else 0, MSE_BYTES=lay.mse_bytes, KPS=lay.key_packed_size,
        VAL_DATA_BYTES=lay.value_data_bytes, FP8_E4B15=fp8_e4b15, SLOT_ALIGN=2)
    want = torch.zeros(reqs, hk, SPLITS, dtype=torch.float64)
    c = centroids.cpu().double()
    for r, h in [(r, h) for r in range(reqs) for h in range(hk)]:
        for s, tokens in enumerate(_split_tokens(int(seq_lens[r]))):
            slots = _slots(kv, table, r, h, tokens).cpu()
            if lay.key_fp8:
                keys = slots[:, :d].contiguous().view(torch.float8_e4m3fn).double().sum()
            else:
                packed = slots[:, :lay.mse_bytes].long()
                keys = c[packed & 0xF].sum() + c[packed >> 4].sum()
                keys += slots[:, lay.mse_bytes:lay.mse_bytes + 2].contiguous().view(torch.float16).double().sum()
            vals = slots[:, lay.key_packed_size:lay.key_packed_size + lay.value_data_bytes].long()
            base = lay.key_packed_size + lay.value_data_bytes
            scale_zero = slots[:, base:base + 4].contiguous().view(torch.float16).double().sum()
            want[r, h, s] = keys + (vals & 0xF).sum() + (vals >> 4).sum() + scale_zero
    got = sink.view(reqs, hk, SPLITS).cpu().double()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-3), (got - want).abs().max()
