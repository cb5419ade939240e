"""Decode throughput with speculative decoding over a TurboQuant KV cache, end to end in vLLM,
each configuration repeated and the runs interleaved.

The comparisons (`--group`):

- `llama`: a 1.1 B random Llama of 24 layers (TurboQuant k8v4 on 20 of them), ngram K=3. Patched
  FULL_AND_PIECEWISE (verify batches in FULL CUDA graphs) and PIECEWISE, against what users of
  unpatched 0.20.0 run: PIECEWISE (the baseline) and eager. (Unpatched FULL_AND_PIECEWISE crashes at
  capture: scenario a of tests/gpu.)
- `hybrid`: the users' configuration, a Qwen3-Next-style hybrid of 24 layers (12 GDN, 12 attention),
  TurboQuant k8v4, ngram K=3 and MTP K=3 (a random MTP layer: drafts are rarely accepted, so this
  times the verify path). Unpatched 0.20.0 refuses TurboQuant on hybrids, so the patched engine is
  compared with the settings a user could fall back to: PIECEWISE (the baseline) and no graphs.
  Releases from 0.21 take TurboQuant on hybrids: `--with-release` adds the release in PIECEWISE, the
  workaround there (its FULL_AND_PIECEWISE emits wrong tokens), as the baseline.

- `drafter`: the drafter's K-1 decode steps on Model Runner V2: a 12-layer hybrid with Qwen3.6-27B's
  attention heads (24/4 of 256) and its MTP layer, MTP K=3, TurboQuant k8v4, FULL_AND_PIECEWISE. The
  line, whose TurboQuant builder lets the speculator refresh the draft metadata in place and run the
  steps as one CUDA graph (patch 0005), against the line without that patch (tree `without`: the
  metadata rebuilt on the host before each step, one graph per step; the baseline). Both verify alike,
  so the difference in time per output token is the draft phase's. After the timed runs each engine
  decodes the first 8 prompts once more, recording every proposal of its speculator (harness.drafts):
  the fused drafter must propose exactly what the per-step one does. A tree given as `sabotaged` joins
  that check only (a known bad tree the check must catch).
- `fallback`: the drafter's decode graphs where the multi-query route steps aside (patch 0010): the same
  hybrid, MTP K=3 on Model Runner V2, TurboQuant k8v4 with `VLLM_TURBOQUANT_ATTENTION_KERNEL=decode` (the
  route off, as on a GPU no tiling fits), FULL_AND_PIECEWISE asked for, which vLLM resolves to PIECEWISE for
  the target. The line (its draft decodes in FULL graphs) and the line without 0010 (tree `without`: draft
  decodes eager, metadata rebuilt before each step) against the release in PIECEWISE (the baseline: its
  FULL_AND_PIECEWISE emits wrong tokens) and the release without speculation. The two lines' proposals are
  compared as the drafter group's are (one untimed pass).
- `ragged`: decodes of different lengths in one launch (patch 0006): the same hybrid (24/4 heads of 256),
  TurboQuant k8v4, ngram K=3 on Model Runner V1 (the hybrids' default), FULL_AND_PIECEWISE, over prompts
  of which every other one never repeats, so its ngram request finds no match and is scheduled one token
  beside the others' 1 + K: batches like [4, 1, 4, 1, ...], which run PIECEWISE (attention eager). The
  line against the line without 0006 (tree `without`, the baseline), which sends every decode after the
  first of another length to the per-request loop. The forced-oracle scenarios with ngram (f-, i- of
  tests/gpu) judge the tokens of such batches.
- `ultraquant`: UltraQuant's verify batches in FULL graphs (patch 0007): the same hybrid (24/4 heads of 256),
  UltraQuant 4-bit (bfloat16, its backend chosen explicitly), ngram K=3 on Model Runner V1 (an MTP drafter's
  layer finds no UltraQuant backend on CUDA), FULL_AND_PIECEWISE and PIECEWISE on the line, against the release
  in PIECEWISE (the baseline; its FULL_AND_PIECEWISE crashes: scenario f-hybrid-uq-ngram3-bfloat16 of
  tests/gpu).
- `verify`: the kernels of a verify batch over long contexts (`--context`, 8192 and 32768 in the
  report), the 1.1 B Llama with ngram K=3: patched FULL_AND_PIECEWISE with the multi-query kernel of
  patch 0007 (`VLLM_TURBOQUANT_ATTENTION_KERNEL=multi_query`) and with the routed decode kernel
  (`decode`, patch 0002's route), against unpatched PIECEWISE (the baseline: the release's per-request
  path, what users run). The KV cache is sized to hold every prompt of the largest batch, so
  prefix caching leaves each run to decode.

Every engine of a group is booted at once (gpu/harness/interleave.py), warmed up, then run in
rounds, the order rotating each round; a run decodes for at least `--min-seconds` (whole passes of
the batch). Printed per configuration and batch size: output tokens/s min / median / max over the
rounds, and the ratio of medians to the group's baseline. Figures, no assertions. Needs a CUDA GPU
and the trees of gpu/host.sh; `gpu/host.sh bench` runs it.

    python benchmarks/bench_spec_e2e.py --group llama --tree unpatched=DIR --tree patched=DIR --path SITE
    python benchmarks/bench_spec_e2e.py --group verify --context 32768 --tree unpatched=DIR --tree patched=DIR
    python benchmarks/bench_spec_e2e.py --group drafter --tree without=DIR --tree patched=DIR [--tree sabotaged=DIR]
    python benchmarks/bench_spec_e2e.py --group fallback --tree without=DIR --tree patched=DIR --tree unpatched=DIR
    python benchmarks/bench_spec_e2e.py --group ragged --tree without=DIR --tree patched=DIR
    python benchmarks/bench_spec_e2e.py --group ultraquant --tree unpatched=DIR --tree patched=DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))

from harness.drafts import first_difference  # noqa: E402
from harness.interleave import Fleet, ratio_of_medians, rotations, spread  # noqa: E402
from harness.models import QWEN3_NEXT12, QWEN3_NEXT12_G6D256_MTP, ModelSpec, build  # noqa: E402
from harness.scenarios import COMMON, Engine, Workload, mtp, ngram  # noqa: E402

LLAMA_1B = ModelSpec(
    name="llama1b-24",
    arch="llama",
    config=dict(
        vocab_size=128, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    seed=1,
    std=0.015,
)

HYBRID_1B = ModelSpec(
    name="qwen3next24-mtp",
    arch="qwen3_next",
    config={**QWEN3_NEXT12.config, "vocab_size": 128, "hidden_size": 1536, "num_hidden_layers": 24,
            "layer_types": ["linear_attention", "full_attention"] * 12, "num_attention_heads": 16,
            "num_key_value_heads": 4, "linear_num_key_heads": 8, "linear_num_value_heads": 16,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 768,
            "shared_expert_intermediate_size": 768},
    seed=1,
    std=0.015,
    mtp_layers=1,
)


LLAMA_1B_LONG = ModelSpec(
    name="llama1b-24-long",
    arch="llama",
    config={**LLAMA_1B.config, "max_position_embeddings": 65536},
    seed=1,
    std=0.015,
)

# Upper bound of the KV cache bytes per token of LLAMA_1B_LONG under k8v4 (47.7 KiB: 20 TurboQuant
# layers x 8 heads x 196 B, 4 bf16 layers x 8 heads x 512 B).
LLAMA_1B_KV_BYTES = 64 << 10


def bench_prompts(vocab: int, count: int = 8, length: int = 512) -> tuple[tuple[int, ...], ...]:
    """Prompts that repeat with different periods, so the ngram drafter proposes drafts."""
    out = []
    for i in range(count):
        period = 16 + 8 * i
        base = [(i * 131 + j * (2 * i + 7) + (j * j) % 13) % vocab for j in range(period)]
        out.append(tuple(base[j % period] for j in range(length)))
    return tuple(out)


def half_matching_prompts(vocab: int, count: int = 8, length: int = 512) -> tuple[tuple[int, ...], ...]:
    """bench_prompts' even prompts; the odd ones never repeat (a step of 2i + 7 through the vocabulary), so
    their ngram requests find no match and decode one token a step."""
    periodic = bench_prompts(vocab, count, length)
    return tuple(periodic[i] if i % 2 == 0 else
                 tuple((i * 131 + j * (2 * i + 7) + (j * j) % 13) % vocab for j in range(length))
                 for i in range(count))


def users_geometry_engine(spec: dict, prompts: tuple[tuple[int, ...], ...], v2: bool, **extra) -> Engine:
    """The 12-layer test hybrid in the users' attention geometry (24/4 heads of 256, width 512) with its MTP
    layer, TurboQuant k8v4 (unless ``extra`` says otherwise), FULL_AND_PIECEWISE, on Model Runner V2 or V1."""
    kwargs = {**COMMON, "max_model_len": 2048, "kv_cache_memory_bytes": 4 << 30, "gpu_memory_utilization": 0.1,
              "kv_cache_dtype": "turboquant_k8v4", "additional_config": {"gdn_prefill_backend": "triton"},
              "speculative_config": spec, **extra}
    workload = (Workload("decode", prompts, max_tokens=256),)
    return Engine(model=QWEN3_NEXT12_G6D256_MTP, kwargs=kwargs, workloads=workload,
                  env=(("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0"),))


def ragged_configurations() -> tuple[list[tuple[str, str, Engine]], str]:
    """The ragged group: one launch for decodes of different lengths (the line) against the line without 0006,
    on Model Runner V1 with ngram K=3 in the users' attention geometry."""
    vocab = QWEN3_NEXT12_G6D256_MTP.config["vocab_size"]
    engine = users_geometry_engine(ngram(3), half_matching_prompts(vocab), v2=False)
    return [("ngram split decodes FULL_AND_PIECEWISE", "without", engine),
            ("ngram one launch FULL_AND_PIECEWISE", "patched", engine)], "ngram split decodes FULL_AND_PIECEWISE"


def ultraquant_configurations() -> tuple[list[tuple[str, str, Engine]], str]:
    """The ultraquant group: UltraQuant verify batches in FULL graphs (patch 0007) against PIECEWISE, on the line
    and on the release (the baseline: what runs there, its FULL graphs crash), ngram K=3 on Model Runner V1 in
    the users' attention geometry (an MTP drafter's layer finds no UltraQuant backend on CUDA)."""
    vocab = QWEN3_NEXT12_G6D256_MTP.config["vocab_size"]
    uq = {"kv_cache_dtype": "ultraquant_4bit", "dtype": "bfloat16",
          "attention_config": {**COMMON["attention_config"], "backend": "ULTRAQUANT"}}
    piecewise = {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}

    def engine(**extra) -> Engine:
        return users_geometry_engine(ngram(3), bench_prompts(vocab), v2=False, **uq, **extra)

    return [("uq ngram line FULL_AND_PIECEWISE", "patched", engine()),
            ("uq ngram line PIECEWISE", "patched", engine(**piecewise)),
            ("uq ngram release PIECEWISE", "unpatched", engine(**piecewise))], "uq ngram release PIECEWISE"


def verify_configurations(context: int) -> tuple[list[tuple[str, str, Engine]], str]:
    """The verify group: the multi-query kernel, the routed decode kernel and the release."""
    model = LLAMA_1B_LONG
    workload = (Workload("decode", bench_prompts(model.config["vocab_size"], length=context), max_tokens=256),)
    base = {**COMMON, "max_model_len": context + 512, "gpu_memory_utilization": 0.1,
            "kv_cache_memory_bytes": max(4 << 30, 8 * (context + 1024) * LLAMA_1B_KV_BYTES),
            "kv_cache_dtype": "turboquant_k8v4", "speculative_config": ngram(3)}

    def engine(kernel: str | None = None, **extra) -> Engine:
        env = (("VLLM_TURBOQUANT_ATTENTION_KERNEL", kernel),) if kernel else ()
        return Engine(model=model, kwargs={**base, **extra}, workloads=workload, env=env)

    return [
        ("patched multi-query FULL_AND_PIECEWISE", "patched", engine("multi_query")),
        ("patched routed decode FULL_AND_PIECEWISE", "patched", engine("decode")),
        ("unpatched PIECEWISE", "unpatched", engine(compilation_config={"cudagraph_mode": "PIECEWISE"})),
    ], "unpatched PIECEWISE"


# Labels of the drafter group's configurations checked for their drafts only (never timed) start with this.
CHECK_ONLY = "check: "


def drafter_configurations(sabotaged: bool) -> tuple[list[tuple[str, str, Engine]], str]:
    """The drafter group: the fused drafter (the line) against the per-step one (the line without 0005), on the
    test hybrid in the users' attention geometry (24/4 heads of 256; 12 layers of width 512)."""
    vocab = QWEN3_NEXT12_G6D256_MTP.config["vocab_size"]
    engine = users_geometry_engine(mtp(3), bench_prompts(vocab), v2=True)
    rows = [("mtp per-step drafter FULL_AND_PIECEWISE", "without", engine),
            ("mtp fused drafter FULL_AND_PIECEWISE", "patched", engine)]
    if sabotaged:
        rows.append((f"{CHECK_ONLY}fused drafter, sabotaged tree", "sabotaged", engine))
    return rows, rows[0][0]


def fallback_configurations() -> tuple[list[tuple[str, str, Engine]], str]:
    """The fallback group: with the multi-query route off, the line's draft decodes in FULL graphs against the
    line without 0010 (eager draft decodes) and the release's workaround (PIECEWISE, the baseline) and plain
    decode, MTP K=3 on Model Runner V2 in the users' attention geometry."""
    vocab = QWEN3_NEXT12_G6D256_MTP.config["vocab_size"]
    line = users_geometry_engine(mtp(3), bench_prompts(vocab), v2=True)
    off = replace(line, env=(*line.env, ("VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode")))
    release = users_geometry_engine(mtp(3), bench_prompts(vocab), v2=True,
                                    compilation_config={"cudagraph_mode": "PIECEWISE"})
    plain = users_geometry_engine(None, bench_prompts(vocab), v2=True)
    return [("mtp route off, draft decodes eager", "without", off),
            ("mtp route off, draft decodes FULL", "patched", off),
            ("mtp release PIECEWISE", "unpatched", release),
            ("release no speculation", "unpatched", plain)], "mtp release PIECEWISE"


def check_drafts(fleet: Fleet, labels: list[str], baseline: str, batch: int = 8) -> list[str]:
    """Each engine's proposals and tokens over one pass of the first ``batch`` prompts, against the baseline's."""
    runs = {label: fleet.drafts(label, "decode", batch) for label in labels}
    base = runs[baseline]
    lines = []
    for label in labels:
        run = runs[label]
        if "error" in run:
            lines.append(f"{label:42} drafts: failed: {run['error']}")
            continue
        proposals = len(run["drafts"])
        drafted = sum(len(d) for p in run["drafts"] for d in p)
        if label == baseline or "error" in base:
            lines.append(f"{label:42} drafts: {proposals} proposals, {drafted} draft tokens")
            continue
        diff = first_difference(base["drafts"], run["drafts"])
        same_tokens = base["tokens"] == run["tokens"]
        verdict = "identical" if diff is None else f"DIFFER at {diff[:160]}"
        lines.append(f"{label:42} drafts: {verdict} to the baseline's ({proposals} proposals, {drafted} draft "
                     f"tokens); output tokens {'identical' if same_tokens else 'DIFFER'}")
    return lines


def configurations(group: str, context: int = 512, with_release: bool = False,
                   sabotaged: bool = False) -> tuple[list[tuple[str, str, Engine]], str]:
    """(label, tree, engine) of a group, and the label of its baseline. ``with_release`` adds the hybrid's
    workaround on releases that take TurboQuant on hybrids (0.21 on): the release in PIECEWISE, which
    becomes the baseline (the release in FULL_AND_PIECEWISE emits wrong tokens, so it is no baseline)."""
    if group == "verify":
        return verify_configurations(context)
    if group == "drafter":
        return drafter_configurations(sabotaged)
    if group == "ragged":
        return ragged_configurations()
    if group == "fallback":
        return fallback_configurations()
    if group == "ultraquant":
        return ultraquant_configurations()
    model = LLAMA_1B if group == "llama" else HYBRID_1B
    workload = (Workload("decode", bench_prompts(model.config["vocab_size"]), max_tokens=256),)
    base = {**COMMON, "max_model_len": 2048, "kv_cache_memory_bytes": 4 << 30, "gpu_memory_utilization": 0.1,
            "kv_cache_dtype": "turboquant_k8v4"}
    if model.arch == "qwen3_next":
        base["additional_config"] = {"gdn_prefill_backend": "triton"}
    graphs = {mode: {"compilation_config": {"cudagraph_mode": mode}} for mode in ("PIECEWISE", "NONE")}

    def engine(spec, **extra) -> Engine:
        return Engine(model=model, kwargs={**base, "speculative_config": spec, **extra}, workloads=workload)

    if group == "llama":
        return [
            ("patched FULL_AND_PIECEWISE", "patched", engine(ngram(3))),
            ("patched PIECEWISE", "patched", engine(ngram(3), **graphs["PIECEWISE"])),
            ("unpatched PIECEWISE", "unpatched", engine(ngram(3), **graphs["PIECEWISE"])),
            ("unpatched eager", "unpatched", engine(ngram(3), enforce_eager=True)),
        ], "unpatched PIECEWISE"
    rows = []
    for name, spec in (("ngram", ngram(3)), ("mtp", mtp(3))):
        rows += [
            (f"{name} patched FULL_AND_PIECEWISE", "patched", engine(spec)),
            (f"{name} patched PIECEWISE", "patched", engine(spec, **graphs["PIECEWISE"])),
            (f"{name} patched no graphs", "patched", engine(spec, **graphs["NONE"])),
        ]
        if with_release:
            rows.append((f"{name} release PIECEWISE", "unpatched", engine(spec, **graphs["PIECEWISE"])))
    return rows, "ngram release PIECEWISE" if with_release else "ngram patched PIECEWISE"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", required=True,
                        choices=("llama", "hybrid", "verify", "drafter", "fallback", "ragged", "ultraquant"))
    parser.add_argument("--context", type=int, default=8192, help="prompt tokens of the verify group")
    parser.add_argument("--tree", action="append", required=True, help="LABEL=DIR for unpatched and patched")
    parser.add_argument("--path", action="append", default=[], help="extra PYTHONPATH entries (dependencies)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/vllm-patch-gpu/work"))
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each configuration (after a warm-up)")
    parser.add_argument("--min-seconds", type=float, default=10.0, help="least decoding time of one run")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--only", default="", help="configurations whose label starts with one of these "
                                                   "comma-separated words (e.g. ngram); the baseline becomes "
                                                   "their PIECEWISE one if the group's is left out")
    parser.add_argument("--with-release", action="store_true",
                        help="hybrid group: add the release in PIECEWISE (the workaround on 0.21 and later, "
                             "which take TurboQuant on hybrids) as the baseline")
    args = parser.parse_args()
    if args.with_release and args.group != "hybrid":
        parser.error("--with-release: only the hybrid group has a release baseline to add")
    trees = {label: Path(path) for label, _, path in (t.partition("=") for t in args.tree)}
    rows, baseline = configurations(args.group, args.context, args.with_release, "sabotaged" in trees)
    if args.only:
        words = tuple(w.strip() for w in args.only.split(","))
        rows = [r for r in rows if r[0].startswith(words)]
        if baseline not in {label for label, _, _ in rows}:
            piecewise = [label for label, _, _ in rows if label.endswith(" PIECEWISE") and "FULL" not in label]
            baseline = next((label for label in piecewise if "release" in label), piecewise[0])
    missing = {tree for _, tree, _ in rows} - set(trees)
    if missing:
        raise SystemExit(f"--tree needed for: {', '.join(sorted(missing))}")
    model = rows[0][2].model
    model_dirs = {model.name: build(model, args.work / "models")}
    started = time.perf_counter()
    fleet = Fleet([(label, engine, trees[tree]) for label, tree, engine in rows], model_dirs, args.work,
                  [Path(p) for p in args.path])
    labels = [label for label, _, _ in rows if not label.startswith(CHECK_ONLY)]
    print(f"[bench] {len(rows)} engines booted in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    results: dict[tuple[str, int], list[float]] = {}
    acceptance: dict[tuple[str, int], tuple[float, float]] = {}
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            for label in labels:  # warm-up: JIT, lazy initialisation
                fleet.run(label, "decode", batch, 2.0)
            for order in rotations(labels, args.rounds):
                for label in order:
                    run = fleet.run(label, "decode", batch, args.min_seconds)
                    if "error" in run:
                        continue
                    results.setdefault((label, batch), []).append(run["tokens"] / run["seconds"])
                    # Progress on stderr: a run cut short by a time limit still shows what it measured.
                    print(f"[bench] {label} batch {batch}: {results[(label, batch)][-1]:.1f} tok/s "
                          f"({run['seconds']:.1f} s)", file=sys.stderr, flush=True)
                    spec = run.get("spec") or {}
                    drafted, accepted = acceptance.get((label, batch), (0.0, 0.0))
                    acceptance[(label, batch)] = (drafted + spec.get("num_draft_tokens", 0.0),
                                                  accepted + spec.get("num_accepted_tokens", 0.0))
        # The drafters whose proposals are compared, against the first row's (the reference drafter).
        compared = {"drafter": rows, "fallback": rows[:2]}.get(args.group, [])
        drafts = check_drafts(fleet, [label for label, _, _ in compared], rows[0][0]) if compared else []
    finally:
        fleet.close()
    prompt = len(rows[0][2].workloads[0].prompts[0])
    cache = rows[0][2].kwargs["kv_cache_dtype"]
    print(f"\n{args.group} on {fleet.platform()}: {model.name}, KV cache {cache}, 8 prompts x {prompt} tokens, "
          "256 tokens each; "
          f"{args.rounds} interleaved runs of >= {args.min_seconds:.0f} s after a warm-up; output tokens/s")
    print(f"{'configuration':42} {'batch':>5} {'min':>8} {'median':>8} {'max':>8} {'vs ' + baseline:>30} "
          f"{'acceptance':>10} {'boot s':>7}")
    for batch in (int(b) for b in args.batches.split(",")):
        for label in labels:
            m = fleet.members[label]
            values = results.get((label, batch), [])
            if not values:
                print(f"{label:42} {batch:>5}  failed: {(m.failed or 'no run')[:120]}")
                continue
            base = results.get((baseline, batch))
            ratio = f"{ratio_of_medians(values, base):.2f}x" if base else "-"
            drafted, accepted = acceptance.get((label, batch), (0.0, 0.0))
            acc = f"{accepted / drafted:.2f}" if drafted else "-"
            print(f"{label:42} {batch:>5} {spread(values)} {ratio:>30} {acc:>10} {m.boot.get('boot_s', '-'):>7}")
    if args.group in ("drafter", "fallback"):
        print("\nms per output token and request (median; with drafts almost never accepted, one engine step):")
        for batch in (int(b) for b in args.batches.split(",")):
            for label in labels:
                values = results.get((label, batch), [])
                if values:
                    print(f"{label:42} {batch:>5} {1000 * batch / sorted(values)[len(values) // 2]:8.2f}")
        print("\nproposals over one untimed pass of 8 prompts x 256 tokens:")
        print("\n".join(drafts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
