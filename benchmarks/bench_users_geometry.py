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
- `release no speculation`: the release in FULL_AND_PIECEWISE without MTP;
- `line no speculation`: the line's series without MTP (where the release cannot boot TurboQuant on a hybrid,
  0.25.1, the baseline "no speculation" then is this one).

`--configurations` picks some of them. `--breakdown` adds, after each workload's timed runs, one profiled pass
per configuration (harness.breakdown): the GPU time of a step in which the whole batch decodes, by stage, and
the host's share (the unprofiled whole-batch decode step's median minus that GPU time).

Workloads: 8 prompts of each `--contexts` length (random tokens), 128 output tokens each, at each
`--batches` size. Every engine is booted at once (harness.interleave), warmed up, then run `--rounds` times
in rotating order, each run at least `--min-seconds` of whole passes. Printed per configuration, context and
batch: output tokens/s min / median / max, the ratios of medians to the baseline and to no speculation,
the acceptance length (tokens a step emits: 1 + accepted drafts per draft round) and first-position
acceptance over all runs, the median engine-step time (min / median / max over the runs' medians; prefill
steps included) and the median of the steps in which the whole batch decoded ("-": none did, so the cell
times prefill and decode mixed; `--output-tokens` longer than the batch's prefill fixes that).
Figures, no assertions. Needs a CUDA GPU and the trees of gpu/stack.sh, which runs it:

    gpu/stack.sh users v0.33 --preset k8v4
    python benchmarks/bench_users_geometry.py --tree unpatched=DIR --tree patched=DIR --preset 4bit_nc
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))

from harness.acceptance import acceptance_length, first_position_rate  # noqa: E402
from harness.interleave import Fleet, ratio_of_medians, rotations, spread  # noqa: E402
from harness.models import QWEN27B_SHAPED_8L_MTP, QWEN27B_SHAPED_MTP, build  # noqa: E402
from harness.scenarios import COMMON, Engine, Workload, mtp  # noqa: E402

MODELS = {8: QWEN27B_SHAPED_8L_MTP, 16: QWEN27B_SHAPED_MTP}
MODEL = QWEN27B_SHAPED_8L_MTP
BASELINE = "release PIECEWISE"
NO_SPEC = "release no speculation"
LINE_NO_SPEC = "line no speculation"
OUTPUT_TOKENS = 128
CAP_ENV = "VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY"
PROFILE_ENV = (("VLLM_CUSTOM_SCOPES_FOR_PROFILING", "1"),)
# The breakdown's columns: stages of harness.breakdown, the drafter's summed.
COLUMNS = (("attn", "target attention"), ("gdn", "target gdn"), ("moe", "target moe"), ("gemm", "target gemm"),
           ("other", "target other"), ("drafter", "drafter"), ("sample", "sampler and rejection"))


def prompts(context: int, count: int = 8) -> tuple[tuple[int, ...], ...]:
    """``count`` prompts of ``context`` random tokens (seeded: every engine and run gets the same)."""
    vocab = MODEL.config["vocab_size"]
    rng = random.Random(context)
    return tuple(tuple(rng.randrange(vocab) for _ in range(context)) for _ in range(count))


def configurations(preset: str, contexts: list[int], tensor_parallel: int = 1, kv_gib: float = 4,
                   env: tuple[tuple[str, str], ...] = (), max_num_seqs: int = 8,
                   output_tokens: int = OUTPUT_TOKENS, model=MODEL) -> list[tuple[str, str, Engine]]:
    """(label, tree, engine) of the comparison; every engine split over ``tensor_parallel`` GPUs, each
    workload ``max_num_seqs`` prompts (at least 8) of ``output_tokens`` tokens each."""
    count = max(8, max_num_seqs)
    workloads = tuple(Workload(f"ctx{c}", prompts(c, count), max_tokens=output_tokens) for c in contexts)
    base = {**COMMON, "load_format": "dummy", "max_model_len": max(contexts) + 2 * output_tokens,
            "kv_cache_memory_bytes": int(kv_gib * 2**30), "gpu_memory_utilization": 0.1,
            "max_num_seqs": max_num_seqs,
            # Prompt chunks of at most 2,048 tokens (`vllm serve`'s default on smaller GPUs): with the offline
            # default, four engines' 8k prefills of batch 8 outgrew an 80 GB GPU.
            "max_num_batched_tokens": 2048,
            "kv_cache_dtype": f"turboquant_{preset}", "additional_config": {"gdn_prefill_backend": "triton"},
            **({"tensor_parallel_size": tensor_parallel} if tensor_parallel > 1 else {})}

    def engine(spec: bool = True, **extra) -> Engine:
        kwargs = {**base, **({"speculative_config": mtp(3)} if spec else {}), **extra}
        return Engine(model=model, kwargs=kwargs, workloads=workloads, env=env)

    return [
        ("line FULL_AND_PIECEWISE", "patched", engine()),
        (BASELINE, "unpatched", engine(compilation_config={"cudagraph_mode": "PIECEWISE"})),
        ("release no graphs", "unpatched", engine(compilation_config={"cudagraph_mode": "NONE"})),
        (NO_SPEC, "unpatched", engine(spec=False)),
        (LINE_NO_SPEC, "patched", engine(spec=False)),
    ]


DEFAULT_CONFIGURATIONS = "line FULL_AND_PIECEWISE,release PIECEWISE,release no graphs,release no speculation"


def stage_columns(summary: dict) -> list[float]:
    """The breakdown's ms per step in COLUMNS' order (the drafter's stages summed) and the rest."""
    stages = summary.get("stages", {})
    values = [sum(v for k, v in stages.items() if k.startswith("drafter")) if name == "drafter"
              else stages.get(name, 0.0) for _, name in COLUMNS]
    return [*values, max(0.0, summary.get("kernel_ms", 0.0) - sum(values))]


def print_breakdown(profiles: dict, decode_steps: dict, cells: list[tuple[int, int]], labels: list[str]) -> None:
    """The step breakdown table: per configuration, context and batch, ms per whole-batch decode step."""
    print("\nstep breakdown: ms of a step in which the whole batch decodes; GPU columns from one profiled pass "
          "(harness.breakdown: kernel time by the model runner's scope and the kernel's name), step = median of "
          "the unprofiled runs' whole-batch decode steps, host = step - GPU busy")
    names = [c for c, _ in COLUMNS] + ["rest"]
    print(f"{'configuration':26} {'context':>7} {'batch':>5} {'step':>7} {'GPU':>7} {'host':>6} "
          + " ".join(f"{n:>7}" for n in names) + f" {'launches':>8}")
    for context, batch in cells:
        for label in labels:
            summary = profiles.get((label, context, batch))
            if not summary or not summary.get("steps"):
                continue
            step = decode_steps.get((label, context, batch))
            step_ms = statistics.median(step) if step else None
            gpu = summary["gpu_ms"]
            host = f"{step_ms - gpu:6.2f}" if step_ms is not None else f"{'-':>6}"
            shown = f"{step_ms:7.2f}" if step_ms is not None else f"{'-':>7}"
            print(f"{label:26} {context:>7} {batch:>5} {shown} "
                  f"{gpu:7.2f} {host} " + " ".join(f"{v:7.2f}" for v in stage_columns(summary))
                  + f" {summary['launches']:8.0f}")
    print("\nhost side of the profiled steps (harness.breakdown.host): CPU ms a step in the runner's scopes, the "
          "profiler's overhead included (a ranking, not a figure)")
    for context, batch in cells:
        for label in labels:
            scopes = (profiles.get((label, context, batch)) or {}).get("host", {}).get("scopes", {})
            if scopes:
                shown = ", ".join(f"{name.removeprefix('gpu_model_runner: ')} {ms:.2f}"
                                  for name, ms in list(scopes.items())[:4])
                print(f"{label:26} {context:>7} {batch:>5}  {shown}")


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
    parser.add_argument("--cells", default=None,
                        help="instead of every context at every batch: CONTEXT:BATCH,BATCH;CONTEXT:BATCH... "
                             "(e.g. '8192:1,8,16,32;32000:1,8')")
    parser.add_argument("--goal", type=float, default=0.7, help="first-position acceptance to calibrate to")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each configuration (after a warm-up)")
    parser.add_argument("--tensor-parallel", type=int, default=1,
                        help="GPUs each engine is split over (2: the users' two cards; 12/2 heads a rank)")
    parser.add_argument("--min-seconds", type=float, default=3.0, help="least decoding time of one run")
    parser.add_argument("--configurations", default=DEFAULT_CONFIGURATIONS,
                        help=f"comma-separated labels (also {LINE_NO_SPEC!r}); the first is calibrated")
    parser.add_argument("--breakdown", action="store_true",
                        help="also profile one pass of each configuration and workload (harness.breakdown)")
    parser.add_argument("--layers", type=int, choices=sorted(MODELS), default=8,
                        help="the model's depth: 8 (6 GDN, 2 attention) or 16")
    parser.add_argument("--kv-gib", type=float, default=4.0, help="KV cache of each engine, GiB")
    parser.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS,
                        help="tokens each request generates; at large batches and contexts the last prompts' "
                             "prefill outlasts the first requests' decode unless it is long enough")
    args = parser.parse_args()
    model = MODELS[args.layers]
    trees = {label: Path(path) for label, _, path in (t.partition("=") for t in args.tree)}
    if args.cells:
        cells = [(int(c), int(b)) for part in args.cells.split(";") for c, _, bs in [part.partition(":")]
                 for b in bs.split(",")]
    else:
        cells = [(int(c), int(b)) for c in args.contexts.split(",") for b in args.batches.split(",")]
    contexts = list(dict.fromkeys(c for c, _ in cells))
    batches = list(dict.fromkeys(b for _, b in cells))
    every = configurations(args.preset, contexts, args.tensor_parallel, args.kv_gib,
                           PROFILE_ENV if args.breakdown else (), max(8, *batches), args.output_tokens, model)
    chosen = [c.strip() for c in args.configurations.split(",") if c.strip()]
    unknown = set(chosen) - {label for label, _, _ in every}
    if unknown:
        raise SystemExit(f"unknown configuration: {', '.join(sorted(unknown))}")
    rows = sorted((r for r in every if r[0] in chosen), key=lambda r: chosen.index(r[0]))
    no_spec = NO_SPEC if NO_SPEC in chosen else LINE_NO_SPEC
    missing = {tree for _, tree, _ in rows} - set(trees)
    if missing:
        raise SystemExit(f"--tree needed for: {', '.join(sorted(missing))}")
    started = time.perf_counter()
    fleet = Fleet([(label, engine, trees[tree]) for label, tree, engine in rows],
                  {model.name: build(model, args.work / "models")}, args.work, [Path(p) for p in args.path])
    labels = [label for label, _, _ in rows]
    print(f"[bench] {len(rows)} engines booted in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    tokens: dict[tuple[str, int, int], list[float]] = {}
    steps: dict[tuple[str, int, int], list[float]] = {}
    counters: dict[tuple[str, int, int], dict] = {}
    decode_steps: dict[tuple[str, int, int], list[float]] = {}
    profiles: dict[tuple[str, int, int], dict] = {}
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
        for context, batch in cells:
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
                    if run.get("decode_step_ms") is not None:
                        decode_steps.setdefault(key, []).append(run["decode_step_ms"])
                    total = counters.setdefault(key, {})
                    for name, value in (run.get("spec") or {}).items():
                        total[name] = ([a + b for a, b in zip(total.get(name, [0.0] * len(value)), value,
                                                              strict=False)]
                                       if isinstance(value, list) else total.get(name, 0.0) + value)
                    print(f"[bench] {label} {workload} batch {batch}: {tokens[key][-1]:.1f} tok/s "
                          f"({run['seconds']:.1f} s)", file=sys.stderr, flush=True)
            for label in labels if args.breakdown else ():
                summary = fleet.ask(label, {"profile": workload, "batch": batch, "steps": 12})
                if "error" in summary:
                    print(f"[bench] {label} {workload} batch {batch}: profile: {summary['error']}",
                          file=sys.stderr)
                    continue
                profiles[(label, context, batch)] = summary
                print(f"[bench] {label} {workload} batch {batch}: profiled {summary['steps']} steps, "
                      f"GPU {summary['gpu_ms']:.2f} ms a step ({summary['trace_mb']} MB trace)",
                      file=sys.stderr, flush=True)
    finally:
        fleet.close()
    split = f", tensor parallel over {args.tensor_parallel} GPUs" if args.tensor_parallel > 1 else ""
    cap = os.environ.get(CAP_ENV)
    print(f"\nusers' geometry on {fleet.platform()}: {model.name} (Qwen3.6-27B widths, {args.layers} "
          f"layers{split}), MTP K=3, "
          f"TurboQuant {args.preset}, shared memory {f'capped: {CAP_ENV}={cap}' if cap else 'of the GPU'}, "
          f"acceptance calibrated to {args.goal:.2f} at the first position (alpha {alpha:.4g}); "
          f"{max(8, *batches)} prompts of each context, {args.output_tokens} tokens each; {args.rounds} interleaved "
          f"runs of >= {args.min_seconds:.0f} s after a warm-up; output tokens/s")
    print(f"{'configuration':26} {'context':>7} {'batch':>5} {'min':>8} {'median':>8} {'max':>8} "
          f"{'vs ' + BASELINE:>20} {'vs no spec':>10} {'accept len':>10} {'pos-1':>6} {'step ms min/med/max':>22} "
          f"{'decode ms':>9}")
    for context, batch in cells:
        for label in labels:
            key = (label, context, batch)
            values = tokens.get(key, [])
            if not values:
                failed = fleet.members[label].failed or "no run"
                print(f"{label:26} {context:>7} {batch:>5}  failed: {failed[:120]}")
                continue
            spec = counters.get(key, {})
            length, first = acceptance_length(spec), first_position_rate(spec)
            step, decoding = steps.get(key), decode_steps.get(key)
            print(f"{label:26} {context:>7} {batch:>5} {spread(values)} "
                  f"{_figure(values, tokens.get((BASELINE, context, batch))):>20} "
                  f"{_figure(values, tokens.get((no_spec, context, batch))):>10} "
                  f"{f'{length:.2f}' if length else '-':>10} {f'{first:.2f}' if first else '-':>6} "
                  f"{(f'{min(step):.2f}/{statistics.median(step):.2f}/{max(step):.2f}' if step else '-'):>22} "
                  f"{(f'{statistics.median(decoding):.2f}' if decoding else '-'):>9}")
    print(f"(vs no spec: against {no_spec!r})")
    if args.breakdown:
        print_breakdown(profiles, decode_steps, cells, labels)
        out = args.work / "breakdown.json"
        out.write_text(json.dumps({f"{label}|{context}|{batch}": v for (label, context, batch), v in profiles.items()},
                                  indent=1))
        print(f"(every stage and the busiest kernels: {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
