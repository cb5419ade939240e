"""Where an engine step's GPU time goes: a torch profiler trace of decode steps, summed by stage.

harness.serve profiles a few steps in which every request of the batch decodes (no prefill, none finished),
names each step's range ``vp_step N``, and hands the chrome trace here. A kernel is attributed through its
launch: the kernel and the CUDA runtime or driver call that launched it share a correlation id (a CUDA graph's
kernels share their ``cudaGraphLaunch``'s), and the launch ran inside vLLM's model-runner scopes, which
``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1`` makes vLLM name (``gpu_model_runner: forward``, ``... draft``,
``... sample``). Within the target's and the drafter's forward, kernel names tell attention (TurboQuant's
kernels and the cache writes), GDN (the gated delta rule, its convolution and gating), MoE, matrix products and
the rest apart.

Kernel times come from the GPU's own timestamps, which the profiler does not slow down; the profiled steps'
wall time is inflated by the profiler's host overhead, so the host's share of a step is better read as an
unprofiled step's time minus the GPU time per step given here (bench_users_geometry does). Where that share is
large, ``host`` says where the CPU goes: the time each runner scope takes per step on the CPU and, within each,
the outermost operators by time (profiled, so inflated alike: a ranking, not a figure).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

STEP_PREFIX = "vp_step "

# vLLM's model-runner scopes (Model Runner V1, vllm/v1/worker/gpu_model_runner.py; on Model Runner V2 the ranges
# harness.scopes opens, whose execute_model holds the input preparation too) and the stage each names.
SCOPES = {
    "gpu_model_runner: forward": "target",
    "gpu_model_runner: execute_model": "target",
    "gpu_model_runner: draft": "drafter",
    "gpu_model_runner: sample": "sampler and rejection",
}
OTHER_SCOPE_PREFIX = "gpu_model_runner: "
OTHER_SCOPES = "runner, other scopes"
UNSCOPED = "outside the runner's scopes"

# Kernel kinds by name, first match wins (GDN's chunk kernels before the matrix products, MoE's fused
# kernel before them too).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("_tq_", "tq_mq", "turboquant", "flash_fwd", "flash_attn", "fmha", "reshape_and_cache",
                   "decode_attention", "paged_attention", "unified_attention")),
    ("gdn", ("gated_delta", "fused_recurrent", "chunk_", "causal_conv1d", "gdn", "l2norm", "solve_tril",
             "recompute_w_u", "kkt", "sigmoid_gating", "mamba", "selective_state")),
    ("moe", ("moe", "topk", "expert", "align_block")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "s16816", "wgmma", "sm90_", "sm80_", "ampere_",
              "splitk", "matmul")),
)
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver"}
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def kind_of(name: str, category: str = "kernel") -> str:
    """The kind of a GPU activity by its name: attention, gdn, moe, gemm, copy or other."""
    if category != "kernel":
        return "copy"
    lowered = name.lower()
    for kind, needles in KINDS:
        if any(n in lowered for n in needles):
            return kind
    return "other"


def stage_of(scope: str | None, kind: str) -> str:
    """The stage of a kernel launched in ``scope`` (the innermost runner scope, or None)."""
    if scope is None:
        return UNSCOPED
    where = SCOPES.get(scope)
    if where is None:
        return OTHER_SCOPES
    if where in ("target", "drafter"):
        return f"{where} {kind}"
    return where


def _key(event: dict[str, Any]) -> tuple[Any, Any]:
    return (event.get("pid"), event.get("tid"))


def _enclosing(events: list[dict[str, Any]], points: list[dict[str, Any]], accept) -> dict[int, dict[str, Any]]:
    """For each point event (by index in ``points``), the innermost range of ``events`` on the same thread that
    contains its start and that ``accept`` takes; a sweep over both, sorted by time."""
    ranges: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if accept(e["name"]):
            ranges[_key(e)].append(e)
    found: dict[int, dict[str, Any]] = {}
    by_thread: dict[tuple[Any, Any], list[tuple[float, int]]] = defaultdict(list)
    for i, p in enumerate(points):
        by_thread[_key(p)].append((float(p["ts"]), i))
    for thread, items in by_thread.items():
        opened = sorted(ranges.get(thread, ()), key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack: list[dict[str, Any]] = []
        j = 0
        for ts, i in sorted(items):
            while j < len(opened) and float(opened[j]["ts"]) <= ts:
                stack.append(opened[j])
                j += 1
            stack = [r for r in stack if float(r["ts"]) + float(r.get("dur", 0)) >= ts]
            if stack:
                # innermost: the latest-starting range still open
                found[i] = max(stack, key=lambda r: float(r["ts"]))
    return found


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def breakdown(trace: dict[str, Any], top: int = 12) -> dict[str, Any]:
    """Per-step GPU time by stage over the trace's ``vp_step`` ranges.

    Returns ``steps`` (how many), ``wall_ms`` (median profiled step range), ``gpu_ms`` (median time a step kept
    the GPU busy: the union of its kernels), ``kernel_ms`` (their sum), ``stages`` (mean ms per step of each
    stage), ``launches`` (mean kernels per step) and ``kernels`` (the ``top`` kernels by time: name, stage, ms and
    count per step).
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    launches = [e for e in events if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in (e.get("args") or {})]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES and "correlation" in (e.get("args") or {})]
    steps_of = _enclosing(annotations, launches, lambda n: n.startswith(STEP_PREFIX))
    scopes_of = _enclosing(annotations, launches, lambda n: n.startswith(OTHER_SCOPE_PREFIX))
    launch_of = {e["args"]["correlation"]: i for i, e in enumerate(launches)}
    steps = sorted({s["name"] for s in steps_of.values()}, key=lambda n: int(n[len(STEP_PREFIX):]))
    if not steps:
        return {"steps": 0, "error": "no kernel launched inside a profiled step"}
    profiled = set(steps)
    walls = [float(e["dur"]) / 1000 for e in annotations if e["name"] in profiled]
    per_stage: dict[str, float] = defaultdict(float)
    per_kernel: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    summed = 0.0
    count = 0
    for k in gpu:
        i = launch_of.get(k["args"]["correlation"])
        if i is None or i not in steps_of:
            continue
        step = steps_of[i]["name"]
        scope = scopes_of.get(i)
        stage = stage_of(scope["name"] if scope else None, kind_of(k["name"], k["cat"]))
        dur = float(k.get("dur", 0)) / 1000
        per_stage[stage] += dur
        per_kernel[(k["name"], stage)][0] += dur
        per_kernel[(k["name"], stage)][1] += 1
        busy[step].append((float(k["ts"]), float(k["ts"]) + float(k.get("dur", 0))))
        summed += dur
        count += 1
    n = len(steps)
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": n,
        "wall_ms": round(statistics.median(walls), 3) if walls else None,
        "gpu_ms": round(statistics.median(_union_us(busy[s]) / 1000 for s in steps), 3),
        "kernel_ms": round(summed / n, 3),
        "launches": round(count / n, 1),
        "stages": {s: round(v / n, 3) for s, v in sorted(per_stage.items(), key=lambda kv: -kv[1])},
        "kernels": [{"name": name[:120], "stage": stage, "ms": round(ms / n, 4), "per_step": round(c / n, 2)}
                    for (name, stage), (ms, c) in ranked],
        "host": host(events, profiled),
    }


def _outermost(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operators no other one of the same thread contains (its callees' time is its own)."""
    out = []
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        by_thread[_key(e)].append(e)
    for items in by_thread.values():
        end = float("-inf")
        for e in sorted(items, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0)))):
            if float(e["ts"]) >= end:
                out.append(e)
                end = float(e["ts"]) + float(e.get("dur", 0))
    return out


def host(events: list[dict[str, Any]], steps: set[str], top: int = 6) -> dict[str, Any]:
    """CPU ms per step of each model-runner scope inside the ``steps`` ranges, and per scope its ``top``
    outermost CPU operators (name, ms and count per step)."""
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    ops = _outermost([e for e in events if e.get("cat") == "cpu_op"])
    runner = [e for e in annotations if e["name"].startswith(OTHER_SCOPE_PREFIX)]
    scopes = [runner[i] for i in _enclosing(annotations, runner, lambda name: name in steps)]
    of_scope = _enclosing(scopes, ops, lambda n: True)
    n = max(len(steps), 1)
    per_scope: dict[str, float] = defaultdict(float)
    for e in scopes:
        per_scope[e["name"]] += float(e.get("dur", 0)) / 1000
    per_op: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for i, scope in of_scope.items():
        entry = per_op[scope["name"]][ops[i]["name"]]
        entry[0] += float(ops[i].get("dur", 0)) / 1000
        entry[1] += 1
    return {
        "scopes": {k: round(v / n, 3) for k, v in sorted(per_scope.items(), key=lambda kv: -kv[1])},
        "ops": {scope: [{"name": name[:120], "ms": round(ms / n, 3), "per_step": round(c / n, 1)}
                        for name, (ms, c) in sorted(found.items(), key=lambda kv: -kv[1][0])[:top]]
                for scope, found in per_op.items()},
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.breakdown TRACE...``: each trace's breakdown as JSON, keyed by its path."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="GPU time by stage and CPU time by scope of profiled steps")
    parser.add_argument("traces", nargs="+", help="chrome traces written by harness.serve's profile command")
    args = parser.parse_args(argv)
    out = {}
    for path in args.traces:
        with open(path) as f:
            out[path] = breakdown(json.load(f))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
