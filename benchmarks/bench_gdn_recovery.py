"""Cost of GDN state recovery (patch 0004) on a non-spec decode step, per GDN layer.

A non-spec decode step of a GDN layer (the packed fast path of `_forward_core_decode_non_spec`) is
`causal_conv1d_update` then `fused_recurrent_gated_delta_rule_packed_decode`. After a step that
accepted drafts, the patched layer reads each request's conv window at the accepted offset and its
SSM state from the block of its last accepted token (`ssm_state_src_indices`), with no copy. This
times, at real model shapes:

- unpatched: the two kernels from the pristine tree, as v0.20.0 runs them on every decode step;
- patched, no recovery: the patched tree's kernels with nothing passed (steps after a step that
  accepted no draft, and every step without speculative decoding);
- patched, recovery: the conv update with the accepted counts, the packed decode with the sources;
- copy: the same recovery done by gathering the SSM states into the slots first, then running the
  kernels on the slots (what a copy-based fix costs, for comparison).

It prints microseconds per layer and step and the ratios against unpatched; the unpatched step is
timed again last ("again"), which shows how far two timings of the same code differ. The whole model's step
also runs the projections, the MoE and the attention layers, so the per-layer ratio bounds the
cost from above.

    python benchmarks/bench_gdn_recovery.py --pristine DIR --patched DIR   # trees holding vllm/
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from vllm_tree import load_module  # noqa: E402

CONV = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"
RECURRENT = "vllm/model_executor/layers/fla/ops/fused_recurrent.py"


@dataclass(frozen=True)
class Shape:
    """One GDN layer's sizes on one GPU (tensor parallel 1)."""

    name: str
    num_k_heads: int
    num_v_heads: int
    head_k: int
    head_v: int
    width: int = 4

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k + self.num_v_heads * self.head_v


SHAPES = {
    "qwen3-next-80b": Shape("qwen3-next-80b", num_k_heads=16, num_v_heads=32, head_k=128, head_v=128),
    "tiny": Shape("tiny", num_k_heads=2, num_v_heads=4, head_k=16, head_v=16),
}


class Layer:
    """The state and inputs of one GDN layer for a decode step of `batch` requests."""

    def __init__(self, shape: Shape, batch: int, num_spec: int, device: str, seed: int = 0) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def randn(*size: int, dtype=torch.bfloat16) -> torch.Tensor:
            return torch.randn(*size, generator=gen).to(device=device, dtype=dtype)

        lines = 1 + batch * (1 + num_spec)  # line 0 is the null block
        dim, width = shape.conv_dim, shape.width
        self.shape = shape
        # vLLM's state layout: conv (lines, W-1+K, dim) viewed (lines, dim, W-1+K); SSM (lines, HV, V, K) fp32.
        self.conv_state = randn(lines, width - 1 + num_spec, dim).transpose(-1, -2)
        self.ssm_state = randn(lines, shape.num_v_heads, shape.head_v, shape.head_k, dtype=torch.float32)
        self.weight = randn(dim, width)
        self.bias = randn(dim)
        self.x = randn(batch, dim)
        self.a = randn(batch, shape.num_v_heads)
        self.b = randn(batch, shape.num_v_heads)
        self.A_log = torch.log(torch.rand(shape.num_v_heads, generator=gen) * 15 + 1).to(device)
        self.dt_bias = torch.ones(shape.num_v_heads, device=device)
        self.out = torch.empty(batch, 1, shape.num_v_heads, shape.head_v, device=device, dtype=torch.bfloat16)
        # Request i owns lines 1 + i*(1+K) .. ; its state slot is the first, its last accepted token's block
        # the a-th, with a = 1 + (i % (K+1)) accepted tokens.
        first = 1 + torch.arange(batch) * (1 + num_spec)
        accepted = 1 + torch.arange(batch) % (1 + num_spec)
        self.state_indices = first.to(device=device, dtype=torch.int32)
        self.src_indices = (first + accepted - 1).to(device=device, dtype=torch.int32)
        self.accepted = accepted.to(device=device, dtype=torch.int32)


def decode_step(conv, recurrent, layer: Layer, recover: str | None) -> None:
    """One non-spec decode step of the layer, as `_forward_core_decode_non_spec` runs it.

    recover: None (nothing to recover), "sources" (the patch) or "copy" (gather into the slots first).
    """
    sources = {}
    if recover == "copy":
        layer.ssm_state[layer.state_indices] = layer.ssm_state[layer.src_indices]
    elif recover == "sources":
        sources = dict(ssm_state_src_indices=layer.src_indices)
    mixed = conv.causal_conv1d_update(
        layer.x, layer.conv_state, layer.weight, layer.bias, "silu",
        conv_state_indices=layer.state_indices,
        num_accepted_tokens=layer.accepted if recover else None,
        validate_data=False,
    )
    recurrent.fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=mixed, a=layer.a, b=layer.b, A_log=layer.A_log, dt_bias=layer.dt_bias,
        scale=layer.shape.head_k ** -0.5, initial_state=layer.ssm_state, out=layer.out,
        ssm_state_indices=layer.state_indices, use_qk_l2norm_in_kernel=True, **sources,
    )


def timer(device: str) -> Callable[[Callable[[], None]], float]:
    """Microseconds per call: median of CUDA graph replays on a GPU, a wall-clock loop under the interpreter."""
    if device == "cuda":
        import triton.testing

        # The step is replayed from a CUDA graph: GPU time without Python's launch overhead, which is
        # the same for every variant and would otherwise dominate (and blur) small batches.
        return lambda fn: triton.testing.do_bench_cudagraph(fn, rep=300, return_mode="median") * 1e3

    def wall(fn: Callable[[], None]) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(3):
            fn()
        return (time.perf_counter() - start) / 3 * 1e6

    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pristine", type=Path, default=Path(os.environ.get("VLLM_PATCH_PRISTINE_TREE", "")))
    parser.add_argument("--patched", type=Path, default=Path(os.environ.get("VLLM_PATCH_PATCHED_TREE", "")))
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-next-80b")
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--num-spec", type=int, default=3, help="draft tokens per step (K)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    trees = {"unpatched": args.pristine, "patched": args.patched}
    mods = {label: (load_module(tree, CONV), load_module(tree, RECURRENT)) for label, tree in trees.items()}
    packed_decode = mods["patched"][1].fused_recurrent_gated_delta_rule_packed_decode
    if "ssm_state_src_indices" not in packed_decode.__code__.co_varnames:
        raise SystemExit(f"{args.patched} has no recovery path in the packed decode: give the patched tree")
    shape, bench = SHAPES[args.shape], timer(device)
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (Triton interpreter)"
    print(f"{where}; GDN layer {shape.name}: {shape.num_k_heads} k-heads, {shape.num_v_heads} v-heads, "
          f"head {shape.head_k}x{shape.head_v}, conv dim {shape.conv_dim}, K={args.num_spec}")
    print(f"{'batch':>5} {'unpatched us':>13} {'patched us':>11} {'recovery us':>12} {'copy us':>8} "
          f"{'patched/unp':>12} {'recovery/unp':>13} {'copy/unp':>9} {'again/unp':>10}")
    variants = (("unpatched", None), ("patched", None), ("patched", "sources"), ("patched", "copy"),
                ("unpatched", None))
    for batch in map(int, args.batches.split(",")):
        layer = Layer(shape, batch, args.num_spec, device)
        base, idle, rec, copy, again = (bench(partial(decode_step, *mods[tree], layer, recover=recover))
                                        for tree, recover in variants)
        print(f"{batch:>5} {base:>13.1f} {idle:>11.1f} {rec:>12.1f} {copy:>8.1f} "
              f"{idle / base:>11.3f}x {rec / base:>12.3f}x {copy / base:>8.3f}x {again / base:>9.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
