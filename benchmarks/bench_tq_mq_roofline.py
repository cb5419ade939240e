"""What bounds the multi-query TurboQuant verify kernel: the kernel against references that share its grid, its
splits, its tiles and its cache, each taking away one part of its work.

For each case, min / median / max of --reps CUDA-event timings of a CUDA graph replay after warm-up (the L2 cache
flushed before each; the graph keeps the Python launch path out of the timing, as the backend's FULL graphs do):

- ``kernel``: the whole call as the backend makes it (query rotation for MSE keys, the split kernel, the reduce);
- ``in L2``: the same call over a block table that sends every request to the same few blocks (at most --l2-mb
  of cache), so the kernel does all its work while its reads hit the L2 cache instead of HBM;
- ``stream``: every byte of the requests' slots read through the same block table, grid, splits and BLOCK_N,
  in words as wide as the slots' alignment allows, and nothing computed: what the paged layout allows;
- ``dequant``: the kernel's own loads (its fields at its alignment) and its dequantization to float16 (FP8 or
  4-bit MSE keys through the centroid table, 4-bit values), summed per column; no dots, no softmax.

With --candidate LABEL=DIR[,block_n=N][,num_warps=W][,num_stages=S][,num_kv_splits=K] (repeatable), the kernel
file of another tree (or the same one with other launch settings) is timed too, in the same run on the same cache
(``LABEL us``), with its %copy, its speed-up over ``kernel`` and the largest difference between their outputs.
Each kernel file runs at the tiles its own ``tq_mq_verify_select`` settles on with its probe on this GPU, as the
backend's builder does before capture (``LABEL tiles``; launch settings given with the candidate override them).

Bytes are those of the requests' slots (B x L x Hk x slot), as in bench_tq_mq_verify.py; GB/s and %copy
against a device-to-device copy measured first (read + written bytes). Reading the columns: ``kernel`` close
to ``in L2`` means HBM is not what bounds it; ``stream`` is the layout's own ceiling; ``dequant`` minus
``stream`` is what turning bytes into float16 costs; the rest of ``kernel`` is the dots and the softmax.
Prints figures, asserts nothing; needs a CUDA GPU.

    python benchmarks/bench_tq_mq_roofline.py --tree DIR   # DIR holds the patched vllm/ ($VLLM_PATCH_PATCHED_TREE)
    python benchmarks/bench_tq_mq_roofline.py --presets k8v4 --head-dims 128 --groups 4 --contexts 8192 --batch 8
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_tq_mq_verify import HEADS, VERIFY, Preset, Timer, copy_bandwidth, load_module, random_cache, spread  # noqa: E402,I001


PRESETS = ("k8v4", "4bit_nc", "k3v4_nc", "3bit_nc")
# The presets the dequantization reference covers: FP8 or 4-bit MSE keys, 4-bit values (3-bit fields: '-').
DEQUANT_PRESETS = ("k8v4", "4bit_nc")
LAUNCH_SETTINGS = ("block_n", "num_warps", "num_stages", "num_kv_splits")


@triton.jit
def _split_range(Seq_lens_ptr, req, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                 MIN_SPLIT: tl.constexpr):
    # The verify kernel's split of a request: an even share, at least MIN_SPLIT, in whole tiles.
    seq_len = tl.load(Seq_lens_ptr + req)
    per_split = tl.maximum(tl.cdiv(seq_len, NUM_SPLITS), MIN_SPLIT)
    split_len = tl.cdiv(per_split, BLOCK_N) * BLOCK_N
    start = split * split_len
    return start, tl.minimum(start + split_len, seq_len)


@triton.jit
def _tile_slots(Block_table_ptr, req, n0, end, stride_block, stride_pos, stride_head, stride_bt, head,
                BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    # The tile's tokens (masked at the split's end) and their slots' offsets, through the block table.
    n = n0 + tl.arange(0, BLOCK_N)
    n_mask = n < end
    page = tl.load(Block_table_ptr + req.to(tl.int64) * stride_bt + n // PAGE_SIZE, mask=n_mask, other=0)
    slot = page.to(tl.int64) * stride_block + (n % PAGE_SIZE).to(tl.int64) * stride_pos + head * stride_head
    return n_mask, slot


@triton.jit
def _stream_slots(KV_ptr, Block_table_ptr, Seq_lens_ptr, Out_ptr, stride_block, stride_pos, stride_head, stride_bt,
                  WORDS: tl.constexpr, WORDS_P2: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  NUM_SPLITS: tl.constexpr, MIN_SPLIT: tl.constexpr):
    """XOR of every word of the split's slots (KV_ptr viewed in words of the slots' alignment)."""
    req, head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start, end = _split_range(Seq_lens_ptr, req, split, NUM_SPLITS, BLOCK_N, MIN_SPLIT)
    w = tl.arange(0, WORDS_P2)
    acc = tl.zeros([BLOCK_N, WORDS_P2], KV_ptr.dtype.element_ty)
    for n0 in range(start, end, BLOCK_N):
        n_mask, slot = _tile_slots(Block_table_ptr, req, n0, end, stride_block, stride_pos, stride_head, stride_bt,
                                   head, BLOCK_N, PAGE_SIZE)
        acc ^= tl.load(KV_ptr + slot[:, None] + w[None, :], mask=n_mask[:, None] & (w[None, :] < WORDS), other=0)
    out = Out_ptr + ((req * tl.num_programs(1) + head) * NUM_SPLITS + split).to(tl.int64)
    tl.store(out, tl.xor_sum(tl.xor_sum(acc, axis=1), axis=0).to(tl.int32))


@triton.jit
def _dequant_tiles(KV_ptr, Block_table_ptr, Seq_lens_ptr, Centroids_ptr, Out_ptr, stride_block, stride_pos,
                   stride_head, stride_bt, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   NUM_SPLITS: tl.constexpr, MIN_SPLIT: tl.constexpr, KEY_FP8: tl.constexpr, MSE_BYTES: tl.constexpr,
                   KPS: tl.constexpr, VAL_DATA_BYTES: tl.constexpr, FP8_E4B15: tl.constexpr,
                   SLOT_ALIGN: tl.constexpr):
    """The verify kernel's loads and dequantization of a split (k8v4 or 4-bit MSE keys, 4-bit values), each
    column summed so nothing is dead; no dots, no softmax."""
    req, head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start, end = _split_range(Seq_lens_ptr, req, split, NUM_SPLITS, BLOCK_N, MIN_SPLIT)
    d = tl.arange(0, HEAD_DIM)
    dh = tl.arange(0, HEAD_DIM // 2)
    if KEY_FP8:
        k_acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    else:
        k_acc = tl.zeros([BLOCK_N, HEAD_DIM // 2], tl.float32)
        table = tl.broadcast_to(tl.load(Centroids_ptr + tl.arange(0, 16))[None, :], (BLOCK_N, 16))
    v_acc = tl.zeros([BLOCK_N, HEAD_DIM // 2], tl.float32)
    s_acc = tl.zeros([BLOCK_N], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n_mask, slot = _tile_slots(Block_table_ptr, req, n0, end, stride_block, stride_pos, stride_head, stride_bt,
                                   head, BLOCK_N, PAGE_SIZE)
        slot = tl.multiple_of(slot, SLOT_ALIGN)
        tile_mask = n_mask[:, None]
        if KEY_FP8:
            k_raw = tl.load(KV_ptr + slot[:, None] + d[None, :], mask=tile_mask, other=0)
            if FP8_E4B15:
                k = k_raw.to(tl.float8e4b15, bitcast=True).to(tl.float16)
            else:
                k = k_raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
            k_acc += k.to(tl.float32)
        else:
            k_raw = tl.load(KV_ptr + slot[:, None] + dh[None, :], mask=tile_mask, other=0)
            c = tl.gather(table, (k_raw & 0xF).to(tl.int32), 1) + tl.gather(table, (k_raw >> 4).to(tl.int32), 1)
            k_acc += tl.where(tile_mask, c, 0.0)
            norm = tl.load(KV_ptr + slot + MSE_BYTES, mask=n_mask, other=0).to(tl.uint16) | (
                tl.load(KV_ptr + slot + MSE_BYTES + 1, mask=n_mask, other=0).to(tl.uint16) << 8)
            s_acc += norm.to(tl.float16, bitcast=True).to(tl.float32)
        sz = slot + KPS + VAL_DATA_BYTES
        sc = tl.load(KV_ptr + sz, mask=n_mask, other=0).to(tl.uint16) | (
            tl.load(KV_ptr + sz + 1, mask=n_mask, other=0).to(tl.uint16) << 8)
        zr = tl.load(KV_ptr + sz + 2, mask=n_mask, other=0).to(tl.uint16) | (
            tl.load(KV_ptr + sz + 3, mask=n_mask, other=0).to(tl.uint16) << 8)
        s_acc += sc.to(tl.float16, bitcast=True).to(tl.float32) + zr.to(tl.float16, bitcast=True).to(tl.float32)
        v_raw = tl.load(KV_ptr + slot[:, None] + KPS + dh[None, :], mask=tile_mask, other=0)
        v_acc += (v_raw & 0xF).to(tl.float16).to(tl.float32) + (v_raw >> 4).to(tl.float16).to(tl.float32)
    total = tl.sum(tl.sum(k_acc, axis=1) + tl.sum(v_acc, axis=1) + s_acc, axis=0)
    tl.store(Out_ptr + ((req * tl.num_programs(1) + head) * NUM_SPLITS + split).to(tl.int64), total)


def graphed(fn):
    """fn captured in a CUDA graph (after a warm-up call that compiles its kernels), returned as the graph's
    replay: the timings are the GPU's, not the Python launch path's (over 1 ms per call of the verify wrapper
    under Triton 3.8), as in the backend's FULL graphs."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def l2_table(table: torch.Tensor, slot_bytes_per_block: int, l2_mb: float) -> torch.Tensor:
    """A block table of the same shape whose entries cycle over request 0's first blocks, at most l2_mb of
    them: every request reads the same few blocks, which stay in the L2 cache after the first touch."""
    blocks = max(1, min(table.shape[1], int(l2_mb * 2**20 // slot_bytes_per_block)))
    cols = torch.arange(table.shape[1], device=table.device) % blocks
    return table[0, cols].expand(table.shape[0], -1).contiguous()


def case(mq, candidates: dict, timer: Timer, p: Preset, args, ctx: int, b: int, g: int, k1: int, sms: int,
         fp8_e4b15: int, copy_gbs: float) -> str:
    """One row: the kernel, in L2, the stream and the dequantization of one shape (or why it is skipped)."""
    lay, d = p.layout, p.layout.head_dim
    hq, hk = HEADS[g]
    cache_bytes = b * ctx * hk * lay.slot_size
    if cache_bytes > args.max_cache_gb * 1e9:
        return f"{p.name:8} {d:>3} {ctx:>6} {b:>3} {k1:>2} skipped: cache {cache_bytes / 1e9:.1f} GB"
    kv, table, seq_lens = random_cache(lay, b, ctx, hk, args.block_size, "cuda", seed=ctx + b + g + d)
    # vLLM's TurboQuant cache is (blocks, Hk, block_size, slot) in memory, each head's page one contiguous run
    # of slots; the kernels see it through transpose(1, 2), as the backend passes it.
    kv = kv.transpose(1, 2).contiguous().transpose(1, 2)
    n = b * k1
    q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    mid = torch.empty(n, hq, args.splits, d + 1, device="cuda")
    qrot = torch.empty(n, hq, d, device="cuda")
    tiles = select_tiles(mq, lay, k1, g, args.block_size)
    splits = mq.tq_mq_verify_num_splits(b * hk * tiles.m_tiles, sms, args.splits)
    min_split = 4 * tiles.block_n
    def kernel(tab, mod=mq, launch=None):
        return mod.triton_turboquant_mq_verify_attention(
            q, kv, tab, seq_lens, k1, p.centroids, d ** -0.5, lay.mse_bits, lay.key_packed_size,
            lay.value_bits, out, mid, qrot, PiT=p.pi, key_fp8=lay.key_fp8,
            norm_correction=lay.norm_correction, max_num_kv_splits=args.splits, **(launch or {}))

    sb, sp, sh = kv.stride(0), kv.stride(1), kv.stride(2)
    sink = torch.empty(b * hk * splits, device="cuda")
    xor_sink = torch.empty(b * hk * splits, dtype=torch.int32, device="cuda")
    align = math.gcd(kv.data_ptr(), sb, sp, sh, 4)
    words = kv.view({4: torch.int32, 2: torch.int16}.get(align, torch.uint8))
    wslot = lay.slot_size_aligned // words.element_size()
    grid = (b, hk, splits)
    common = dict(BLOCK_N=tiles.block_n, PAGE_SIZE=args.block_size, NUM_SPLITS=splits, MIN_SPLIT=min_split,
                  num_warps=tiles.num_warps, num_stages=tiles.num_stages)

    def stream():
        _stream_slots[grid](words, table, seq_lens, xor_sink, sb // words.element_size(),
                            sp // words.element_size(), sh // words.element_size(), table.stride(0),
                            WORDS=wslot, WORDS_P2=triton.next_power_of_2(wslot), **common)

    def dequant():
        _dequant_tiles[grid](kv, table, seq_lens, p.centroids, sink, sb, sp, sh, table.stride(0),
                             HEAD_DIM=d, KEY_FP8=1 if lay.key_fp8 else 0, MSE_BYTES=lay.mse_bytes,
                             KPS=lay.key_packed_size, VAL_DATA_BYTES=lay.value_data_bytes,
                             FP8_E4B15=fp8_e4b15, SLOT_ALIGN=math.gcd(kv.data_ptr(), sb, sp, sh, 16),
                             **common)

    hot = l2_table(table, sb, args.l2_mb)
    t_kernel = timer(graphed(lambda: kernel(table)))
    t_l2 = timer(graphed(lambda: kernel(hot)))
    t_stream = timer(graphed(stream))
    t_deq = timer(graphed(dequant)) if p.name in DEQUANT_PRESETS else None
    reference = kernel(table).float().clone()
    cand_text = ""
    for mod, launch in candidates.values():
        cand_tiles = select_tiles(mod, lay, k1, g, args.block_size)
        t_cand = timer(graphed(lambda mod=mod, launch=launch: kernel(table, mod, launch)))
        diff = (kernel(table, mod, launch).float() - reference).abs().max().item()
        cgbs = cache_bytes / t_cand[1] / 1e3
        cand_text += (f" {tiles_text(cand_tiles, launch):>13} {spread(t_cand):>22} {100 * cgbs / copy_gbs:>4.0f}% "
                      f"{t_kernel[1] / t_cand[1]:>5.2f}x {diff:>8.1e}")
    gbs = cache_bytes / t_kernel[1] / 1e3
    sgbs = cache_bytes / t_stream[1] / 1e3
    tile_text = tiles_text(tiles, {})
    return (f"{p.name:8} {d:>3} {ctx:>6} {b:>3} {k1:>2} {f'{hq}/{hk}':>5} {tile_text:>13} {splits:>3} "
            f"{cache_bytes / 1e6:>7.1f} {spread(t_kernel):>22} {100 * gbs / copy_gbs:>4.0f}% "
            f"{spread(t_l2):>22} {spread(t_stream):>22} {100 * sgbs / copy_gbs:>4.0f}% "
            f"{spread(t_deq) if t_deq else '-':>22} {t_kernel[1] / t_l2[1]:>5.2f} {t_kernel[1] / t_stream[1]:>5.2f} "
            f"{f'{t_deq[1] / t_stream[1]:.2f}' if t_deq else '-':>7}"
            + cand_text)


def select_tiles(mod, lay, k1: int, g: int, block_size: int):
    """The tiles the backend's builder settles on before capture: the module's own tq_mq_verify_select with its
    probe (compile and launch each candidate on this GPU), remembered by the module for its launches."""
    device = torch.device("cuda", torch.cuda.current_device())
    limits = mod.tq_mq_device_limits(device.index)
    probe = functools.partial(
        mod.tq_mq_verify_probe, k1=k1, group=g, head_dim=lay.head_dim, mse_bits=lay.mse_bits, key_fp8=lay.key_fp8,
        key_packed_size=lay.key_packed_size, value_bits=lay.value_bits, block_size=block_size,
        query_dtype=torch.bfloat16, device=device, limits=limits)
    tiles, refused = mod.tq_mq_verify_select(k1, g, lay.head_dim, lay.mse_bits, lay.key_fp8, limits, probe,
                                             device_index=device.index)
    if tiles is None:
        raise SystemExit(f"bench_tq_mq_roofline: no tiling of {mod.__file__} runs here: {'; '.join(refused)}")
    return tiles


def tiles_text(tiles, launch: dict[str, int]) -> str:
    block_n, warps = launch.get("block_n", tiles.block_n), launch.get("num_warps", tiles.num_warps)
    return f"{tiles.block_m}x{tiles.m_tiles} n{block_n} w{warps}"


def parse_candidate(spec: str) -> tuple[str, tuple[Path, dict[str, int]]]:
    """LABEL=DIR[,name=value...] -> (LABEL, (DIR, launch settings))."""
    label, sep, rest = spec.partition("=")
    tree, *settings = rest.split(",")
    if not sep or not label or not tree:
        raise SystemExit(f"bench_tq_mq_roofline: --candidate takes LABEL=DIR[,name=value...], got {spec!r}")
    launch = {}
    for item in settings:
        name, eq, value = item.partition("=")
        if not eq or name not in LAUNCH_SETTINGS or not value.isdigit():
            raise SystemExit(f"bench_tq_mq_roofline: bad launch setting {item!r} in --candidate {spec!r}")
        launch[name] = int(value)
    return label, (Path(tree), launch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(os.environ.get("VLLM_PATCH_PATCHED_TREE", "")))
    parser.add_argument("--presets", default=",".join(PRESETS), help=f"any of {', '.join(PRESETS)}")
    parser.add_argument("--head-dims", default="128,256")
    parser.add_argument("--groups", default="4,6", help=f"GQA ratios G = Hq/Hk; (Hq, Hk) per G: {HEADS}")
    parser.add_argument("--contexts", default="8192,32768")
    parser.add_argument("--batch", default="8,32")
    parser.add_argument("--k1", default="4", help="queries per request (K+1)")
    parser.add_argument("--candidate", action="append", default=[], help="LABEL=DIR: another tree's kernel to time")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--splits", type=int, default=32, help="max KV splits (as the backend's)")
    parser.add_argument("--l2-mb", type=float, default=8.0, help="cache the in-L2 table cycles over")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--max-cache-gb", type=float, default=24.0, help="skip cases whose cache is larger")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_tq_mq_roofline needs a CUDA GPU")
    presets = args.presets.split(",")
    for name in presets:
        if name not in PRESETS:
            raise SystemExit(f"bench_tq_mq_roofline: preset {name} is not one of {', '.join(PRESETS)}")
    mq = load_module(args.tree, VERIFY)
    candidates = {label: (load_module(tree, VERIFY), launch) for label, (tree, launch) in
                  (parse_candidate(spec) for spec in args.candidate)}
    timer = Timer(args.warmup, max(args.reps, 1))
    copy_gbs = copy_bandwidth(timer)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fp8_e4b15 = 1 if torch.cuda.get_device_capability() < (8, 9) else 0
    print(f"{torch.cuda.get_device_name(0)} ({sms} SMs); block size {args.block_size}, bf16 queries; {args.reps} "
          f"CUDA-event timings after {args.warmup} warm-up runs, L2 flushed before each: median [min-max] us; "
          f"in-L2 cache {args.l2_mb:g} MB")
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    print(f"{'preset':8} {'D':>3} {'ctx':>6} {'B':>3} {'K1':>2} {'Hq/Hk':>5} {'tiles':>13} {'spl':>3} {'MB':>7} "
          f"{'kernel us':>22} {'%copy':>5} {'in L2 us':>22} {'stream us':>22} {'%copy':>5} {'dequant us':>22} "
          f"{'k/L2':>5} {'k/str':>5} {'deq/str':>7}"
          + "".join(f" {label + ' tiles':>13} {label + ' us':>22} {'%copy':>5} {'x':>6} {'max|diff|':>8}"
                    for label in candidates))
    for preset, d in itertools.product(presets, map(int, args.head_dims.split(","))):
        p = Preset(preset, d)
        for ctx, b, g, k1 in itertools.product(map(int, args.contexts.split(",")), map(int, args.batch.split(",")),
                                               map(int, args.groups.split(",")), map(int, args.k1.split(","))):
            print(case(mq, candidates, timer, p, args, ctx, b, g, k1, sms, fp8_e4b15, copy_gbs), flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
