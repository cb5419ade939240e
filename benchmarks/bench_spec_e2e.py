"""Decode throughput with speculative decoding over a TurboQuant KV cache, end to end in vLLM.

A 1.0 B-parameter random Llama (small vocabulary, so the ngram drafter finds matches), TurboQuant
k8v4, ngram K=3, a batch of 8 prompts of 512 tokens, 256 greedy tokens each. Compared, one engine
at a time in its own process (tests/gpu/harness), after a warm-up pass:

- patched, FULL_AND_PIECEWISE (vLLM's default; verify batches in FULL CUDA graphs, patch 0002);
- patched and unpatched, cudagraph_mode=PIECEWISE (the workaround users of v0.20.0 run today);
- unpatched, enforce_eager (the other workaround).

(Unpatched FULL_AND_PIECEWISE crashes at capture: scenario a of tests/gpu shows it.)

Prints output tokens/s, the ratio to the unpatched PIECEWISE workaround, the drafts' acceptance, and
how many prompts got exactly the workaround's greedy tokens (a throughput figure means nothing if the
output is wrong: the graphs run the same kernels, so all 8 should match).
Needs a CUDA GPU and the trees of tests/gpu/host.sh; `tests/gpu/host.sh bench` runs it.

    python benchmarks/bench_spec_e2e.py --tree unpatched=DIR --tree patched=DIR --path SITE --work DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "gpu"))

from harness import runner  # noqa: E402
from harness.models import ModelSpec, build  # noqa: E402
from harness.scenarios import COMMON, Engine, Workload, ngram  # noqa: E402

LLAMA_1B = ModelSpec(
    name="llama1b",
    arch="llama",
    config=dict(
        vocab_size=128, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    seed=1,
    std=0.015,
)


def bench_prompts(vocab: int, count: int = 8, length: int = 512) -> tuple[tuple[int, ...], ...]:
    """Prompts that repeat with different periods, so the ngram drafter proposes drafts."""
    out = []
    for i in range(count):
        period = 16 + 8 * i
        base = [(i * 131 + j * (2 * i + 7) + (j * j) % 13) % vocab for j in range(period)]
        out.append(tuple(base[j % period] for j in range(length)))
    return tuple(out)


def engines() -> list[tuple[str, str, Engine]]:
    """(label, tree, engine) in the order they run."""
    workload = (Workload("decode", bench_prompts(LLAMA_1B.config["vocab_size"]), max_tokens=256),)
    base = {**COMMON, "max_model_len": 2048, "kv_cache_memory_bytes": 4 << 30, "gpu_memory_utilization": 0.3,
            "kv_cache_dtype": "turboquant_k8v4", "speculative_config": ngram(3)}
    piecewise = {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}

    def engine(**extra) -> Engine:
        return Engine(model=LLAMA_1B, kwargs={**base, **extra}, workloads=workload)

    return [
        ("patched FULL_AND_PIECEWISE", "patched", engine()),
        ("patched PIECEWISE", "patched", engine(**piecewise)),
        ("unpatched PIECEWISE (workaround)", "unpatched", engine(**piecewise)),
        ("unpatched eager (workaround)", "unpatched", engine(enforce_eager=True)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="LABEL=DIR for unpatched and patched")
    parser.add_argument("--path", action="append", default=[], help="extra PYTHONPATH entries (dependencies)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/vllm-patch-gpu/work"))
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per engine")
    args = parser.parse_args()
    trees = {label: Path(path) for label, _, path in (t.partition("=") for t in args.tree)}
    missing = {"unpatched", "patched"} - set(trees)
    if missing:
        raise SystemExit(f"--tree needed for: {', '.join(sorted(missing))}")
    model_dir = build(LLAMA_1B, args.work / "models")
    rows = []
    for label, tree, engine in engines():
        result = runner.run_engine(engine, trees[tree], model_dir, args.work / "bench" / tree,
                                   [Path(p) for p in args.path], args.work / "cache", args.timeout)
        rows.append((label, result))
        state = "ok" if result.get("booted") and "error" not in result else "failed"
        print(f"[bench] {label}: {state} in {result['wall_s']} s", flush=True)
    base = next((r["workloads"]["decode"] for label, r in rows
                 if label.startswith("unpatched PIECEWISE") and "decode" in r.get("workloads", {})), None)
    baseline = base["tokens_per_s"] if base else None
    print("\n1.0 B random Llama, TurboQuant k8v4, ngram K=3, 8 prompts x 512 tokens, 256 tokens each")
    print(f"{'configuration':34} {'tok/s':>8} {'vs PIECEWISE workaround':>24} {'acceptance':>11} {'boot s':>7} "
          f"{'same tokens':>12}")
    for label, result in rows:
        decode = result.get("workloads", {}).get("decode")
        if decode is None:
            err = result.get("error") or {}
            why = f"{err.get('type')}: {err.get('message')}" if err else result.get("failure", "no result")
            print(f"{label:34} {'-':>8} {'-':>24} {'-':>11} {result.get('boot_s', '-'):>7}  {why[:110]}")
            continue
        tps = decode["tokens_per_s"]
        spec = decode.get("spec") or {}
        drafted = spec.get("num_draft_tokens") or 0
        acc = f"{spec.get('num_accepted_tokens', 0) / drafted:.2f}" if drafted else "-"
        ratio = f"{tps / baseline:.2f}x" if baseline else "-"
        same = f"{sum(a == b for a, b in zip(decode['tokens'], base['tokens'], strict=True))}/{len(base['tokens'])}" \
            if base else "-"
        print(f"{label:34} {tps:>8.1f} {ratio:>24} {acc:>11} {result.get('boot_s', '-'):>7} {same:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
