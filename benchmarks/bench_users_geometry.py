"""What a user of a Qwen3.6-27B-class hybrid on MTP sees: decode speed in that model's geometry, with drafts
accepted at a realistic rate, the line against the release's workarounds and against no speculation.

The model has Qwen3.6-27B's widths (hidden 5120; 24/4 attention heads of 256; GDN 16/48 heads of 128; three
GDN layers to one attention layer) in 8 layers instead of 64, with its MTP layer (harness.models:
QWEN27B_SHAPED_8L_MTP), so four engines fit one GPU at once; figures are therefore higher than a 64-layer
model's, and the ratios are what carries over. Random weights would make drafts almost never accepted;
harness.acceptance writes weights whose MTP drafts the target accepts at a chosen first-position rate (the
target follows a fixed next-token rule that its random layers perturb by a calibrated amount; the MTP layer
knows the rule). The line's engine is calibrated first (`--goal`, 0.7 by default: 60-80% per position is
what MTP drafts of real models get), then every engine is given the same weights.

Configurations (MTP K=3, TurboQuant `--preset`, Model Runner of the release's default):

- `line FULL_AND_PIECEWISE`: the line's series, verify batches in FULL CUDA graphs;
- `release PIECEWISE` (the baseline): the workaround users of the release run (its FULL_AND_PIECEWISE emits
  wrong tokens with speculation over TurboQuant);
- `release no graphs`: the other workaround;
- `release no speculation`: the release in FULL_AND_PIECEWISE without MTP.

Workloads: 8 prompts of each `--contexts` length (random tokens), 128 output tokens each, at each
`--batches` size. Every engine is booted at once (harness.interleave), warmed up, then run `--rounds` times
in rotating order, each run at least `--min-seconds` of whole passes. Printed per configuration, context and
batch: output tokens/s min / median / max, the ratios of medians to the baseline and to no speculation,
the acceptance length (tokens a step emits: 1 + accepted drafts per draft round) and first-position
acceptance over all runs, and the median engine-step time (min / median / max over the runs' medians).
Figures, no assertions. Needs a CUDA GPU and the trees of gpu/stack.sh, which runs it:

    gpu/stack.sh users v0.33 --preset k8v4
    python benchmarks/bench_users_geometry.py --tree unpatched=DIR --tree patched=DIR --preset 4bit_nc
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))

from harness.acceptance import acceptance_length, first_position_rate  # noqa: E402
from harness.interleave import Fleet, ratio_of_medians, rotations, spread  # noqa: E402
from harness.models import QWEN27B_SHAPED_8L_MTP, build  # noqa: E402
from harness.scenarios import COMMON, Engine, Workload, mtp  # noqa: E402

MODEL = QWEN27B_SHAPED_8L_MTP
BASELINE = "release PIECEWISE"
NO_SPEC = "release no speculation"
OUTPUT_TOKENS = 128


def prompts(context: int, count: int = 8) -> tuple[tuple[int, ...], ...]:
    """``count`` prompts of ``context`` random tokens (seeded: every engine and run gets the same)."""
    vocab = MODEL.config["vocab_size"]
    rng = random.Random(context)
    return tuple(tuple(rng.randrange(vocab) for _ in range(context)) for _ in range(count))


def configurations(preset: str, contexts: list[int], tensor_parallel: int = 1) -> list[tuple[str, str, Engine]]:
    """(label, tree, engine) of the comparison; every engine split over ``tensor_parallel`` GPUs."""
    workloads = tuple(Workload(f"ctx{c}", prompts(c), max_tokens=OUTPUT_TOKENS) for c in contexts)
    base = {**COMMON, "load_format": "dummy", "max_model_len": max(contexts) + 2 * OUTPUT_TOKENS,
            "kv_cache_memory_bytes": 4 << 30, "gpu_memory_utilization": 0.1,
            # Prompt chunks of at most 2,048 tokens (`vllm serve`'s default on smaller GPUs): with the offline
            # default, four engines' 8k prefills of batch 8 outgrew an 80 GB GPU.
            "max_num_batched_tokens": 2048,
            "kv_cache_dtype": f"turboquant_{preset}", "additional_config": {"gdn_prefill_backend": "triton"},
            **({"tensor_parallel_size": tensor_parallel} if tensor_parallel > 1 else {})}

    def engine(spec: bool = True, **extra) -> Engine:
        kwargs = {**base, **({"speculative_config": mtp(3)} if spec else {}), **extra}
        return Engine(model=MODEL, kwargs=kwargs, workloads=workloads)

    return [
        ("line FULL_AND_PIECEWISE", "patched", engine()),
        (BASELINE, "unpatched", engine(compilation_config={"cudagraph_mode": "PIECEWISE"})),
        ("release no graphs", "unpatched", engine(compilation_config={"cudagraph_mode": "NONE"})),
        (NO_SPEC, "unpatched", engine(spec=False)),
    ]


def _figure(values: list[float], baseline: list[float] | None) -> str:
    return f"{ratio_of_medians(values, baseline):.2f}x" if baseline else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="LABEL=DIR for unpatched and patched")
    parser.add_argument("--path", action="append", default=[], help="extra PYTHONPATH entries (dependencies)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/vllm-patch-gpu/work"))
    parser.add_argument("--preset", choices=("k8v4", "4bit_nc", "3bit_nc"), default="k8v4")
    parser.add_argument("--contexts", default="1024,8192", help="prompt lengths, comma-separated")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--goal", type=float, default=0.7, help="first-position acceptance to calibrate to")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each configuration (after a warm-up)")
    parser.add_argument("--tensor-parallel", type=int, default=1,
                        help="GPUs each engine is split over (2: the users' two cards; 12/2 heads a rank)")
    parser.add_argument("--min-seconds", type=float, default=3.0, help="least decoding time of one run")
    args = parser.parse_args()
    trees = {label: Path(path) for label, _, path in (t.partition("=") for t in args.tree)}
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    rows = configurations(args.preset, contexts, args.tensor_parallel)
    missing = {tree for _, tree, _ in rows} - set(trees)
    if missing:
        raise SystemExit(f"--tree needed for: {', '.join(sorted(missing))}")
    started = time.perf_counter()
    fleet = Fleet([(label, engine, trees[tree]) for label, tree, engine in rows],
                  {MODEL.name: build(MODEL, args.work / "models")}, args.work, [Path(p) for p in args.path])
    labels = [label for label, _, _ in rows]
    print(f"[bench] {len(rows)} engines booted in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    tokens: dict[tuple[str, int, int], list[float]] = {}
    steps: dict[tuple[str, int, int], list[float]] = {}
    counters: dict[tuple[str, int, int], dict] = {}
    try:
        calibration = fleet.ask(labels[0], {"calibrate": f"ctx{contexts[0]}", "batch": 8, "goal": args.goal})
        if "error" in calibration:
            raise SystemExit(f"calibration failed: {calibration['error']}")
        alpha = calibration["alpha"]
        print(f"[bench] calibrated: alpha {alpha:.4g} from probes "
              f"{', '.join(f'{a:.3g}: {r:.2f}' for a, r in calibration['probes'])}", file=sys.stderr, flush=True)
        for label in labels[1:]:
            answer = fleet.ask(label, {"weights": alpha})
            if "error" in answer and fleet.members[label].failed:  # did not boot: its rows say why
                print(f"[bench] {label}: not booted: {fleet.members[label].failed[:200]}", file=sys.stderr)
            elif "error" in answer:  # that engine would time another model: no comparison
                raise SystemExit(f"{label}: weights failed: {answer['error']}")
        for context in contexts:
            for batch in batches:
                workload = f"ctx{context}"
                for label in labels:  # warm-up: JIT, lazy initialisation, the prompts into the prefix cache
                    fleet.run(label, workload, batch, 1.0)
                for order in rotations(labels, args.rounds):
                    for label in order:
                        run = fleet.run(label, workload, batch, args.min_seconds)
                        if "error" in run:
                            print(f"[bench] {label} {workload} batch {batch}: {run['error']}", file=sys.stderr)
                            continue
                        key = (label, context, batch)
                        tokens.setdefault(key, []).append(run["tokens"] / run["seconds"])
                        if run.get("step_ms") is not None:
                            steps.setdefault(key, []).append(run["step_ms"])
                        total = counters.setdefault(key, {})
                        for name, value in (run.get("spec") or {}).items():
                            total[name] = ([a + b for a, b in zip(total.get(name, [0.0] * len(value)), value,
                                                                  strict=False)]
                                           if isinstance(value, list) else total.get(name, 0.0) + value)
                        print(f"[bench] {label} {workload} batch {batch}: {tokens[key][-1]:.1f} tok/s "
                              f"({run['seconds']:.1f} s)", file=sys.stderr, flush=True)
    finally:
        fleet.close()
    split = f", tensor parallel over {args.tensor_parallel} GPUs" if args.tensor_parallel > 1 else ""
    print(f"\nusers' geometry: {MODEL.name} (Qwen3.6-27B widths, 8 layers{split}), MTP K=3, TurboQuant {args.preset}, "
          f"acceptance calibrated to {args.goal:.2f} at the first position (alpha {alpha:.4g}); 8 prompts of each "
          f"context, {OUTPUT_TOKENS} tokens each; {args.rounds} interleaved runs of >= {args.min_seconds:.0f} s "
          f"after a warm-up; output tokens/s")
    print(f"{'configuration':26} {'context':>7} {'batch':>5} {'min':>8} {'median':>8} {'max':>8} "
          f"{'vs ' + BASELINE:>20} {'vs no spec':>10} {'accept len':>10} {'pos-1':>6} {'step ms min/med/max':>22}")
    for context in contexts:
        for batch in batches:
            for label in labels:
                key = (label, context, batch)
                values = tokens.get(key, [])
                if not values:
                    failed = fleet.members[label].failed or "no run"
                    print(f"{label:26} {context:>7} {batch:>5}  failed: {failed[:120]}")
                    continue
                spec = counters.get(key, {})
                length, first = acceptance_length(spec), first_position_rate(spec)
                step = steps.get(key)
                print(f"{label:26} {context:>7} {batch:>5} {spread(values)} "
                      f"{_figure(values, tokens.get((BASELINE, context, batch))):>20} "
                      f"{_figure(values, tokens.get((NO_SPEC, context, batch))):>10} "
                      f"{f'{length:.2f}' if length else '-':>10} {f'{first:.2f}' if first else '-':>6} "
                      f"{(f'{min(step):.2f}/{statistics.median(step):.2f}/{max(step):.2f}' if step else '-'):>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
