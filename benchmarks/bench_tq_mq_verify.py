"""Spec-verify attention over a TurboQuant cache, against the HBM roofline: the multi-query kernel of patch 0007
(one program per request x KV head x KV split reads each cache tile once for all K+1 queries and all query heads
of the KV head) against the routed decode path of patch 0002 (the decode kernel on B*(K+1) rows) and v0.20.0's
per-request path (one decode launch per request), per context length, batch, K+1 and GQA ratio.

For each case: min / median / max of --reps CUDA-event timings after warm-up (the L2 cache flushed before each),
the bytes of compressed cache the attention must read (B x L x Hk x slot bytes), the multi-query kernel's
achieved GB/s and its fraction of the device-to-device copy bandwidth measured first by this script (read +
written bytes of a large copy), the speed-ups, and the largest output difference between the new kernel and
the routed path. Prints figures, asserts nothing; needs a CUDA GPU.

The caches hold random bytes (finite FP8 keys, fixed norms and value scales): timing does not depend on the
data, and a cache of 32 x 128k tokens is built in a moment. The per-request path is timed without its host
bookkeeping (lengths and tables built beforehand): a lower bound of the release's cost.

    python benchmarks/bench_tq_mq_verify.py --tree DIR   # DIR holds the patched vllm/ ($VLLM_PATCH_PATCHED_TREE)
    python benchmarks/bench_tq_mq_verify.py --contexts 32768 --batch 8 --k1 4 --groups 4 \\
        --configs 64,4,2 --configs 32,4,1 --configs 128,8,2   # try tile configs (block_n,num_warps,num_stages)
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from references import TQLayout, gaussian_centroids, hadamard  # noqa: E402
from vllm_tree import load_module  # noqa: E402

VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
# G -> (query heads, KV heads): Llama-style 32/8 and Qwen3.6-27B's 24/4.
HEADS = {1: (8, 8), 2: (16, 8), 4: (32, 8), 6: (24, 4), 8: (32, 4)}


def fp16_bytes(value: float, device) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float16, device=device).view(torch.uint8)


def random_cache(layout: TQLayout, num_reqs: int, ctx: int, hk: int, block_size: int, device, seed: int):
    """(kv_cache, block_table, seq_lens): random slot bytes with finite keys, norms and value scales."""
    gen = torch.Generator(device=device).manual_seed(seed)
    per_req = math.ceil(ctx / block_size)
    num_blocks = num_reqs * per_req + 1
    kv = torch.randint(0, 256, (num_blocks, block_size, hk, layout.slot_size_aligned), generator=gen,
                       dtype=torch.uint8, device=device)
    d = layout.head_dim
    if layout.key_fp8:
        kv[..., :d] = (kv[..., :d] & 0x87) | 0x30  # sign, exponent 6, random mantissa: +-[0.5, 1)
    else:
        kv[..., layout.mse_bytes: layout.mse_bytes + 2] = fp16_bytes(1.5, device)  # key norms
    base = layout.key_packed_size + layout.value_data_bytes
    kv[..., base: base + 2] = fp16_bytes(0.125, device)  # value scale
    kv[..., base + 2: base + 4] = fp16_bytes(-0.9, device)  # value zero
    order = torch.randperm(num_blocks - 1, generator=gen, device=device).to(torch.int32) + 1
    table = order.view(num_reqs, per_req)
    seq_lens = torch.full((num_reqs,), ctx, dtype=torch.int32, device=device)
    return kv, table, seq_lens


class Timer:
    """(min, median, max) of CUDA-event timings of a callable in microseconds, each after an L2 flush."""

    def __init__(self, warmup: int, reps: int):
        self.warmup, self.reps = warmup, reps
        self.flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")

    def __call__(self, fn) -> tuple[float, float, float]:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return min(times), statistics.median(times), max(times)


def copy_bandwidth(timer: Timer) -> float:
    """GB/s of a 2 GiB device-to-device copy, read plus written bytes."""
    src = torch.empty(2**31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src))[1]
    return 2 * 2**31 / us / 1e3


class Preset:
    """A preset's layout and the quantizer constants every launch takes."""

    def __init__(self, name: str, d: int):
        self.name = name
        self.layout = TQLayout.from_preset(name, d)
        self.centroids = gaussian_centroids(d, self.layout.centroid_bits).cuda()
        self.pi = hadamard(d, "cuda")
        lay = self.layout
        self.decode_kwargs = dict(Pi=self.pi, centroids=self.centroids, mse_bits=lay.mse_bits,
                                  key_packed_size=lay.key_packed_size, value_quant_bits=lay.value_bits,
                                  key_fp8=lay.key_fp8, norm_correction=lay.norm_correction, PiT=self.pi)


def measure(mq, dec, timer: Timer, p: Preset, kv, table, seq_lens, k1: int, hq: int, splits: int, configs,
            per_request: bool) -> tuple[tuple, object, tuple, tuple, float]:
    """(new, its best config, routed, per-request, max |new - routed|) for one case; timings (min, median, max) us."""
    b, ctx, d = table.shape[0], int(seq_lens[0]), p.layout.head_dim
    n = b * k1
    scale = d ** -0.5
    lay = p.layout
    q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    mid = torch.empty(n, hq, splits, d + 1, device="cuda")
    qrot = torch.empty(n, hq, d, device="cuda")

    def new(cfg):
        extra = {} if cfg is None else dict(block_n=cfg[0], num_warps=cfg[1], num_stages=cfg[2])
        if cfg is not None and len(cfg) > 3:
            extra["num_kv_splits"] = cfg[3]
        return mq.triton_turboquant_mq_verify_attention(
            q, kv, table, seq_lens, k1, p.centroids, scale, lay.mse_bits, lay.key_packed_size, lay.value_bits,
            out, mid, qrot, PiT=p.pi, key_fp8=lay.key_fp8, norm_correction=lay.norm_correction,
            max_num_kv_splits=splits, **extra)

    # The routed decode path (patch 0002): its lengths and repeated table are built once per step, not per layer.
    offs = torch.arange(1 - k1, 1, device="cuda", dtype=torch.int32)
    r_lens = (seq_lens[:, None] + offs).clamp_min(0).reshape(-1)
    r_table = table.repeat_interleave(k1, dim=0)
    bufs = dict(mid_o_buf=torch.empty(n, hq, splits, d + 1, device="cuda"),
                output_buf=torch.empty(n, hq, d, device="cuda"), lse_buf=torch.empty(n, hq, device="cuda"),
                max_num_kv_splits=splits)

    def routed():
        return dec.triton_turboquant_decode_attention(q, kv, r_table, r_lens, scale=scale, **p.decode_kwargs,
                                                      **bufs)

    t_new, cfg = min(((timer(lambda cfg=cfg: new(cfg)), cfg) for cfg in configs), key=lambda tc: tc[0][1])
    t_routed = timer(routed)
    diff = (new(cfg).float() - routed().float()).abs().max().item()
    t_req = (float("nan"),) * 3
    if per_request:
        # v0.20.0's continuation path: one decode launch per request (host bookkeeping done beforehand).
        per = [(q[r * k1:(r + 1) * k1], table[r:r + 1].expand(k1, -1),
                torch.arange(ctx - k1 + 1, ctx + 1, device="cuda", dtype=torch.int32)) for r in range(b)]

        def loop():
            for qr, tr, lr in per:
                dec.triton_turboquant_decode_attention(qr, kv, tr, lr, scale=scale, **p.decode_kwargs,
                                                       max_num_kv_splits=splits)

        t_req = timer(loop)
    return t_new, cfg, t_routed, t_req, diff


def spread(t: tuple[float, float, float]) -> str:
    return f"{t[1]:.1f} [{t[0]:.1f}-{t[2]:.1f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(os.environ.get("VLLM_PATCH_PATCHED_TREE", "")))
    parser.add_argument("--contexts", default="1024,8192,32768,131072")
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--k1", default="2,4,8", help="queries per request (K+1); 1 compares with plain decode")
    parser.add_argument("--groups", default="4,6", help=f"GQA ratios G = Hq/Hk; (Hq, Hk) per G: {HEADS}")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--presets", default="k8v4")
    parser.add_argument("--splits", type=int, default=32, help="max KV splits (the decode path's, and the scratch)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--configs", action="append", default=[],
                        help="block_n,num_warps,num_stages[,num_kv_splits] for the new kernel; repeat to try "
                             "several (best shown)")
    parser.add_argument("--no-per-request", action="store_true", help="skip the release's per-request path")
    parser.add_argument("--max-cache-gb", type=float, default=24.0, help="skip cases whose cache is larger")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_tq_mq_verify needs a CUDA GPU")
    mq = load_module(args.tree, VERIFY)
    dec = load_module(args.tree, DECODE)
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs] or [None]

    d, bs, splits = args.head_dim, args.block_size, args.splits
    timer = Timer(args.warmup, max(args.reps, 1))
    copy_gbs = copy_bandwidth(timer)
    print(f"{torch.cuda.get_device_name(0)}; D={d}, block size {bs}, bf16 queries, decode splits {splits}; "
          f"{args.reps} CUDA-event timings after {args.warmup} warm-up runs, L2 flushed before each: "
          "median [min-max] us; GB/s and x (speed-up) from medians")
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    print(f"{'preset':8} {'ctx':>6} {'B':>3} {'K1':>2} {'G':>1} {'Hq/Hk':>5} {'cache MB':>9} {'new us':>22} "
          f"{'GB/s':>6} {'%copy':>5} {'routed us':>22} {'x':>6} {'per-req us':>10} {'x':>6} {'max|diff|':>9}"
          + ("  config" if configs != [None] else ""))
    for preset in args.presets.split(","):
        p = Preset(preset, d)
        for ctx, b, g in itertools.product(map(int, args.contexts.split(",")), map(int, args.batch.split(",")),
                                           map(int, args.groups.split(","))):
            hq, hk = HEADS[g]
            cache_bytes = b * ctx * hk * p.layout.slot_size
            if cache_bytes > args.max_cache_gb * 1e9:
                print(f"{preset:8} {ctx:>6} {b:>3}    {g:>1}  skipped: cache {cache_bytes / 1e9:.1f} GB")
                continue
            kv, table, seq_lens = random_cache(p.layout, b, ctx, hk, bs, "cuda", seed=ctx + b + g)
            for k1 in map(int, args.k1.split(",")):
                t_new, cfg, t_routed, t_req, diff = measure(mq, dec, timer, p, kv, table, seq_lens, k1, hq, splits,
                                                            configs, not args.no_per_request)
                gbs = cache_bytes / t_new[1] / 1e3
                print(f"{preset:8} {ctx:>6} {b:>3} {k1:>2} {g:>1} {f'{hq}/{hk}':>5} {cache_bytes / 1e6:>9.1f} "
                      f"{spread(t_new):>22} {gbs:>6.0f} {100 * gbs / copy_gbs:>4.0f}% {spread(t_routed):>22} "
                      f"{t_routed[1] / t_new[1]:>5.1f}x {t_req[1]:>10.1f} {t_req[1] / t_new[1]:>5.1f}x {diff:>9.2e}"
                      + (f"  {cfg}" if cfg is not None else ""), flush=True)
            del kv, table, seq_lens
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
