"""Spec-verify attention over a TurboQuant cache: the routed call of patch 0002 (one decode-kernel
launch for all B*(K+1) query rows) against v0.20.0's continuation path (one launch per request,
with `arange(cached+1, seq+1)` lengths and the request's block table expanded), at several
context lengths. Prints microseconds per step and the ratio; needs a CUDA GPU.

    python benchmarks/bench_tq_verify.py --tree DIR   # DIR holds the patched vllm/
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from references import build_tq_cache  # noqa: E402
from vllm_tree import load_module  # noqa: E402

DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"


def per_request(mod, q, cache, k1, kwargs, scale):
    """v0.20.0's continuation path: one launch per request."""
    outs = []
    for r in range(cache.seq_lens.shape[0]):
        length = int(cache.seq_lens[r])
        lens = torch.arange(length - k1 + 1, length + 1, device=q.device, dtype=torch.int32)
        table = cache.block_table[r:r + 1].expand(k1, -1)
        outs.append(mod.triton_turboquant_decode_attention(q[r * k1:(r + 1) * k1], cache.kv_cache, table, lens,
                                                           scale=scale, **kwargs))
    return torch.cat(outs)


def routed(mod, q, cache, k1, kwargs, scale, bufs):
    b = cache.seq_lens.shape[0]
    lens = mod.tq_spec_verify_seq_lens(cache.seq_lens, b, k1)
    table = mod.tq_spec_verify_block_table(cache.block_table, b, k1)
    return mod.triton_turboquant_decode_attention(q, cache.kv_cache, table, lens, scale=scale, **kwargs, **bufs)


def measure(mod, preset: str, ctx: int, b: int, k1: int, hq: int, hk: int, d: int) -> tuple[float, float, float]:
    """Microseconds per step for both paths, and their largest output difference."""
    import triton.testing

    scale = d ** -0.5
    cache = build_tq_cache(preset, [ctx] * b, hk, d, 16, "cuda", dtype=torch.bfloat16)
    kwargs = cache.decode_kwargs
    q = torch.randn(b * k1, hq, d, device="cuda", dtype=torch.bfloat16)
    splits = 32
    bufs = dict(mid_o_buf=torch.empty(b * k1, hq, splits, d + 1, device="cuda", dtype=torch.float32),
                output_buf=torch.empty(b * k1, hq, d, device="cuda", dtype=torch.float32),
                lse_buf=torch.empty(b * k1, hq, device="cuda", dtype=torch.float32),
                max_num_kv_splits=splits)
    want = per_request(mod, q, cache, k1, kwargs, scale)
    got = routed(mod, q, cache, k1, kwargs, scale, bufs)
    diff = (want.float() - got.float()).abs().max().item()
    t_loop = triton.testing.do_bench(lambda: per_request(mod, q, cache, k1, kwargs, scale)) * 1e3
    t_routed = triton.testing.do_bench(lambda: routed(mod, q, cache, k1, kwargs, scale, bufs)) * 1e3
    return t_loop, t_routed, diff


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(os.environ.get("VLLM_PATCH_PATCHED_TREE", "")))
    parser.add_argument("--contexts", default="1024,8192,32768")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--k1", type=int, default=4, help="queries per request (K+1)")
    parser.add_argument("--heads", default="32,8", help="query heads, kv heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--presets", default="k8v4,4bit_nc")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_tq_verify needs a CUDA GPU")
    mod = load_module(args.tree, DECODE)
    if not hasattr(mod, "tq_spec_verify_seq_lens"):
        raise SystemExit(f"{args.tree} has no routed spec-verify path: give the patched tree")
    hq, hk = map(int, args.heads.split(","))
    d, k1, b = args.head_dim, args.k1, args.batch
    print(f"{torch.cuda.get_device_name(0)}; B={b} requests x K+1={k1} queries, Hq={hq} Hk={hk} D={d}, bf16")
    print(f"{'preset':8} {'context':>8} {'per-request us':>15} {'routed us':>10} {'speed-up':>9} {'max |diff|':>11}")
    for preset in args.presets.split(","):
        for ctx in map(int, args.contexts.split(",")):
            t_loop, t_routed, diff = measure(mod, preset, ctx, b, k1, hq, hk, d)
            print(f"{preset:8} {ctx:>8} {t_loop:>15.1f} {t_routed:>10.1f} {t_loop / t_routed:>8.2f}x {diff:>11.2e}")
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
