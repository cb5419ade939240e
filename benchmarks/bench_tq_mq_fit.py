"""What fitting a smaller GPU costs: the multi-query verify kernel at the tiles the route selects under another
GPU's shared-memory limit, against the tiles it selects on this GPU, in the same run.

The route (``tq_mq_verify_select`` with ``tq_mq_verify_probe``, as the backend calls it before the first
capture) picks the tiles for each limit: this GPU's own (the H100: 232448 B per block), 101376 B (RTX 3090/
4090/5090, A5000/A6000, L4/L40S) and 65536 B (T4, the ROCm parts). The smaller limits are emulated on this GPU:
the tiles are those a 99 KiB or 64 KiB part gets, timed on this GPU's SMs and memory, so the ratio is what the
tiles cost, not what the other GPU would measure. Geometry: Qwen3.6-27B (24/4 heads, head dim 256), random
cache bytes, bf16 queries.

For each case the configurations are timed interleaved (one timing of each in turn, L2 flushed before each),
after warm-up: min / median / max of --reps CUDA-event timings, and the ratio of medians against this GPU's
tiles. Prints figures, asserts nothing; needs a CUDA GPU.

    python benchmarks/bench_tq_mq_fit.py --tree DIR   # DIR holds the patched vllm/ ($VLLM_PATCH_PATCHED_TREE)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import os
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from bench_tq_mq_verify import VERIFY, Preset, random_cache  # noqa: E402

from vllm_tree import load_module  # noqa: E402

LIMITS = {"own": None, "99KiB": 101376, "64KiB": 65536}


def select(mq, p: Preset, k1: int, group: int, limit: int | None, block_size: int):
    """The tiles the route takes under ``limit`` (this GPU's own limits when None)."""
    own = mq.tq_mq_device_limits(0)
    limits = own if limit is None else dataclasses.replace(own, max_shared=min(own.max_shared, limit))
    lay = p.layout
    probe = functools.partial(
        mq.tq_mq_verify_probe, k1=k1, group=group, head_dim=lay.head_dim, mse_bits=lay.mse_bits,
        key_fp8=lay.key_fp8, key_packed_size=lay.key_packed_size, value_bits=lay.value_bits,
        block_size=block_size, query_dtype=torch.bfloat16, device=torch.device("cuda", 0), limits=limits)
    tiles, refused = mq.tq_mq_verify_select(k1, group, lay.head_dim, lay.mse_bits, lay.key_fp8, limits, probe)
    if tiles is None:
        raise SystemExit(f"no tiles fit {limit}: {refused}")
    return tiles


def launch(mq, p: Preset, q, kv, table, seq_lens, k1: int, out, mid, qrot, splits: int, tiles):
    lay = p.layout
    return mq.triton_turboquant_mq_verify_attention(
        q, kv, table, seq_lens, k1, p.centroids, lay.head_dim ** -0.5, lay.mse_bits, lay.key_packed_size,
        lay.value_bits, out, mid, qrot, PiT=p.pi, key_fp8=lay.key_fp8, norm_correction=lay.norm_correction,
        max_num_kv_splits=splits, tiles=tiles)


def interleaved(fns: dict, warmup: int, reps: int) -> dict[str, tuple[float, float, float]]:
    """(min, median, max) microseconds per callable, timed in turn, each after an L2 flush."""
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3)
    return {name: (min(t), statistics.median(t), max(t)) for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(os.environ.get("VLLM_PATCH_PATCHED_TREE", "")))
    parser.add_argument("--presets", default="4bit_nc,k3v4_nc,3bit_nc,k8v4")
    parser.add_argument("--contexts", default="8192,32768")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--k1", default="2,4")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_tq_mq_fit needs a CUDA GPU")
    mq = load_module(args.tree, VERIFY)
    hq, hk, d, bs, splits = 24, 4, 256, 16, 32
    group = hq // hk
    print(f"{torch.cuda.get_device_name(0)}; Qwen3.6-27B geometry ({hq}/{hk} heads, D={d}), block size {bs}, "
          f"bf16 queries; {args.reps} interleaved CUDA-event timings after {args.warmup} warm-up runs, L2 flushed "
          "before each: median [min-max] us; x = median / median at this GPU's own tiles")
    for preset in args.presets.split(","):
        p = Preset(preset, d)
        lay = p.layout
        for ctx, b, k1 in itertools.product(map(int, args.contexts.split(",")), map(int, args.batch.split(",")),
                                            map(int, args.k1.split(","))):
            kv, table, seq_lens = random_cache(lay, b, ctx, hk, bs, "cuda", seed=ctx + b)
            n = b * k1
            q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(q)
            mid = torch.empty(n, hq, splits, d + 1, device="cuda")
            qrot = torch.empty(n, hq, d, device="cuda")
            tiles = {name: select(mq, p, k1, group, limit, bs) for name, limit in LIMITS.items()}

            run = functools.partial(launch, mq, p, q, kv, table, seq_lens, k1, out, mid, qrot, splits)
            timed = interleaved({name: functools.partial(run, t) for name, t in tiles.items()}, args.warmup, args.reps)
            base = timed["own"][1]
            cells = "  ".join(
                f"{name} [{tiles[name].block_m}x{tiles[name].m_tiles} n{tiles[name].block_n}] "
                f"{t[1]:.1f} [{t[0]:.1f}-{t[2]:.1f}] {t[1] / base:.2f}x" for name, t in timed.items())
            print(f"{preset:8} ctx {ctx:>6} B {b:>2} K1 {k1}  {cells}", flush=True)
            del kv, table, seq_lens
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
