"""Judge engine results against their references and render JSON and markdown. Pure.

A scenario's verdict on one vLLM tree:
- `crash`: the engine under test did not boot or died while generating;
- `invalid`: the reference crashed, or its greedy output is too uniform to reveal a
  wrong result (fewer than MIN_DISTINCT distinct tokens for some prompt);
- `diverged`: booted, but some prompt's tokens differ from the reference's;
- `pass`: every prompt's tokens equal the reference's.

Scenarios with the `twin` oracle compare the engine with itself in PIECEWISE mode: tokens and the
logprob of every token must be bit-identical (`diverged` names the first position that is not).

Scenarios with the `teacher` oracle (speculative vs plain decoding) judge instead whether every
token the test emitted is the greedy choice of a prefill over the same prefix, within a
tolerance: exact comparison stops meaning anything after the first near-tie that rounding
flips, while a wrong state shows as a token far from the greedy choice. The tolerance is
calibrated on the reference engine (the same model without speculation), whose own tokens are
scored the same way: decode and prefill run different kernels, so even correct tokens miss the
prefill's choice by some rounding noise, which grows with the model's logit scale and shrinks
with a finer dtype. A token is off the greedy choice when its gap exceeds
max(TEACHER_TOL, NOISE_FACTOR x the reference's largest gap) for that workload. When that
tolerance reaches the reference's median top-1/top-2 margin, the noise could flip ordinary
decisions and the scenario is `invalid`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIN_DISTINCT = 8
# The least tolerance, in nats: bf16 logits of magnitude ~10 are rounded to ~0.06.
TEACHER_TOL = 0.1
# How far beyond the reference's own decode-vs-prefill noise a correct token may land.
NOISE_FACTOR = 2.0


@dataclass
class WorkloadJudgement:
    name: str
    match: bool
    first_mismatch: list[int | None]
    ref_distinct: list[int]
    tokens_per_s: float | None
    ref_tokens_per_s: float | None
    spec: dict[str, float] = field(default_factory=dict)
    # Teacher-forced scores (oracle "teacher"): the tolerance (see the module docstring); per
    # prompt, the first output position whose token is more than `tolerance` below the greedy
    # choice; the largest gap of the test and of the reference's own tokens; the median
    # top-1/top-2 margin of the reference.
    tolerance: float | None = None
    off_greedy: list[int | None] | None = None
    max_gap: float | None = None
    ref_max_gap: float | None = None
    ref_median_margin: float | None = None
    # Oracle "twin": per prompt, the first output position whose logprob differs from the reference's
    # (bit for bit; a missing one differs), and the largest difference over the positions both emitted
    # the same token.
    logprob_mismatch: list[int | None] | None = None
    max_logprob_diff: float | None = None

    @property
    def acceptance(self) -> float | None:
        drafted = self.spec.get("num_draft_tokens")
        return self.spec.get("num_accepted_tokens", 0.0) / drafted if drafted else None


@dataclass
class Judgement:
    scenario: str
    tree: str
    verdict: str
    detail: str
    workloads: list[WorkloadJudgement]
    test: dict[str, Any]
    reference: dict[str, Any]


def first_mismatch(got: list[int], want: list[int]) -> int | None:
    """The first position where two token lists differ (a length difference counts), or None."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def _crash_text(result: dict[str, Any]) -> str:
    err = result.get("error") or {}
    if not err:
        return result.get("failure", "no result")
    return f"{err.get('type')}: {err.get('message')} at {err.get('at')}"


def first_off_greedy(gaps: list[float], tol: float = TEACHER_TOL) -> int | None:
    """The first position whose token is more than tol nats below the greedy choice, or None."""
    return next((i for i, g in enumerate(gaps) if g > tol), None)


def _teacher(got: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """The teacher-forced fields of a WorkloadJudgement (empty when a side was not scored)."""
    if "teacher" not in got or "teacher" not in ref:
        return {}
    gaps = [s["gap"] for s in got["teacher"]]
    margins = sorted(m for s in ref["teacher"] for m in s["margin"] if m is not None)
    ref_max_gap = max((x for s in ref["teacher"] for x in s["gap"]), default=0.0)
    tolerance = max(TEACHER_TOL, NOISE_FACTOR * ref_max_gap)
    return {
        "tolerance": tolerance,
        "off_greedy": [first_off_greedy(g, tolerance) for g in gaps],
        "max_gap": max((x for g in gaps for x in g), default=0.0),
        "ref_max_gap": ref_max_gap,
        "ref_median_margin": margins[len(margins) // 2] if margins else None,
    }


def judge(scenario: str, tree: str, test: dict[str, Any], reference: dict[str, Any],
          oracle: str = "tokens", control: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Judgement:
    """`control` (oracle `twin`): the results of the control twin (test, reference), the same engine without the
    backend under test, where FULL graphs may change a decode by themselves."""
    def verdict(v: str, detail: str, workloads: list[WorkloadJudgement] | None = None) -> Judgement:
        return Judgement(scenario, tree, v, detail, workloads or [], _summary(test), _summary(reference))

    if not test.get("booted") or test.get("error"):
        stage = "at boot" if not test.get("booted") else "while generating"
        return verdict("crash", f"{stage}: {_crash_text(test)}")
    if not reference.get("booted") or reference.get("error"):
        return verdict("invalid", f"reference crashed: {_crash_text(reference)}")
    judged: list[WorkloadJudgement] = []
    for name, ref in reference["workloads"].items():
        got = test["workloads"].get(name, {"tokens": [], "tokens_per_s": None, "spec": {}})
        mism = [first_mismatch(g, w) for g, w in zip(got["tokens"], ref["tokens"], strict=False)]
        if len(got["tokens"]) != len(ref["tokens"]):
            mism.append(0)
        judged.append(WorkloadJudgement(
            name=name,
            match=all(m is None for m in mism),
            first_mismatch=mism,
            ref_distinct=[len(set(t)) for t in ref["tokens"]],
            tokens_per_s=got.get("tokens_per_s"),
            ref_tokens_per_s=ref.get("tokens_per_s"),
            spec=got.get("spec") or {},
            **_teacher(got, ref),
        ))
    degenerate = [w.name for w in judged if min(w.ref_distinct, default=0) < MIN_DISTINCT]
    if degenerate:
        return verdict("invalid", f"reference output too uniform in {', '.join(degenerate)} "
                                  f"(< {MIN_DISTINCT} distinct tokens in a prompt)", judged)
    if oracle == "teacher":
        return _judge_teacher(verdict, judged)
    if oracle == "twin":
        return _judge_twin(verdict, judged, test, reference, control)
    bad = [w for w in judged if not w.match]
    if bad:
        parts = [f"{w.name}: first mismatch per prompt {w.first_mismatch}" for w in bad]
        return verdict("diverged", "; ".join(parts), judged)
    return verdict("pass", "tokens equal the reference's", judged)


def _logprob_mismatch(got: list[int], got_lp: list[float | None], want: list[int],
                      want_lp: list[float | None]) -> tuple[int | None, float]:
    """The first position where two runs' logprobs differ (or one run stopped), and the largest difference
    over the leading positions where both emitted the same token."""
    largest, n = 0.0, min(len(got), len(want), len(got_lp), len(want_lp))
    for i in range(n):
        if got[i] != want[i]:
            return i, largest
        if got_lp[i] is None or want_lp[i] is None or got_lp[i] != want_lp[i]:
            if got_lp[i] is not None and want_lp[i] is not None:
                largest = max(largest, abs(got_lp[i] - want_lp[i]))
            first = i
            for j in range(i + 1, n):
                if got[j] != want[j]:
                    break
                if got_lp[j] is not None and want_lp[j] is not None:
                    largest = max(largest, abs(got_lp[j] - want_lp[j]))
            return first, largest
    same = len(got) == len(want) == len(got_lp) == len(want_lp)
    return (None if same else n), largest


def _first_differences(test: dict[str, Any], reference: dict[str, Any],
                       name: str) -> list[tuple[int | None, float]] | None:
    """Per prompt of a workload: where two runs' logprobs first differ, and by how much (None: none recorded)."""
    got, ref = test["workloads"].get(name, {}), reference["workloads"].get(name, {})
    if "logprobs" not in got or "logprobs" not in ref:
        return None
    found = [_logprob_mismatch(g, gl, r, rl) for g, gl, r, rl in
             zip(got["tokens"], got["logprobs"], ref["tokens"], ref["logprobs"], strict=False)]
    return found + [(0, 0.0)] * (len(ref["tokens"]) - len(found))


def _judge_twin(verdict, judged: list[WorkloadJudgement], test: dict[str, Any], reference: dict[str, Any],
                control: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Judgement:
    """Oracle `twin`: the engine must reproduce its own PIECEWISE run bit for bit, tokens and logprobs. With a
    control (the same engine without the backend under test), a prompt may first differ no earlier than the
    control's does: what FULL graphs change by themselves is not the backend's, and after the first difference
    the two runs compute other numbers, so nothing later is compared."""
    for w in judged:
        found = _first_differences(test, reference, w.name)
        if found is None:
            return verdict("invalid", f"{w.name}: no logprobs recorded", judged)
        w.logprob_mismatch = [f for f, _ in found]
        w.max_logprob_diff = max((d for _, d in found), default=0.0)
    if control is not None:
        if not all(r.get("booted") and not r.get("error") for r in control):
            return verdict("invalid", "the control crashed", judged)
        early = []
        for w in judged:
            base = _first_differences(*control, w.name)
            if base is None:
                return verdict("invalid", f"{w.name}: the control recorded no logprobs", judged)
            if any(m is not None and (b is None or m < b) for m, (b, _) in zip(w.logprob_mismatch, base,
                                                                              strict=False)):
                early.append(f"{w.name}: first logprob differing per prompt {w.logprob_mismatch}, the control's "
                             f"{[b for b, _ in base]}")
        if early:
            return verdict("diverged", "differs from PIECEWISE before the control does: " + "; ".join(early), judged)
        firsts = {w.name: w.logprob_mismatch for w in judged}
        return verdict("pass", f"differs from PIECEWISE nowhere before the same engine without it does (first "
                               f"logprob differing per prompt: {firsts})", judged)
    bad = [w for w in judged if not w.match or any(m is not None for m in w.logprob_mismatch or [])]
    if bad:
        parts = [f"{w.name}: first logprob differing per prompt {w.logprob_mismatch} (largest difference "
                 f"{w.max_logprob_diff:.3g} nats), first token differing {w.first_mismatch}" for w in bad]
        return verdict("diverged", "; ".join(parts), judged)
    total = sum(len(t) for w in judged for t in test["workloads"][w.name]["tokens"])
    return verdict("pass", f"tokens and logprobs bit-identical to the same engine in PIECEWISE ({total} tokens)",
                   judged)


def _judge_teacher(verdict, judged: list[WorkloadJudgement], reference: str = "a prefill") -> Judgement:
    unscored = [w.name for w in judged if w.off_greedy is None]
    if unscored:
        return verdict("invalid", f"no teacher-forced scores for {', '.join(unscored)}", judged)
    noisy = [w for w in judged if w.ref_median_margin is not None and w.tolerance >= w.ref_median_margin]
    if noisy:
        parts = [f"{w.name}: tolerance {w.tolerance:.3f} (the reference's own tokens miss {reference}'s greedy "
                 f"choice by up to {w.ref_max_gap:.3f}) >= its median margin {w.ref_median_margin:.3f}"
                 for w in noisy]
        return verdict("invalid", f"{'; '.join(parts)} (the oracle is too noisy to judge)", judged)
    bad = [w for w in judged if any(p is not None for p in w.off_greedy)]
    if bad:
        parts = [f"{w.name}: first token off the greedy choice per prompt {w.off_greedy} "
                 f"(largest gap {w.max_gap:.2f} nats > tolerance {w.tolerance:.2f}; first exact mismatch "
                 f"{w.first_mismatch})" for w in bad]
        return verdict("diverged", "; ".join(parts), judged)
    exact = sum(m is None for w in judged for m in w.first_mismatch)
    total = sum(len(w.first_mismatch) for w in judged)
    within = ", ".join(f"{w.name} {w.max_gap:.3f} <= {w.tolerance:.3f}" for w in judged)
    return verdict("pass", f"every token is the greedy choice of {reference} over the same prefix within the "
                           f"reference's noise "
                           f"(largest gap vs tolerance: {within}); {exact}/{total} prompts equal the reference's "
                           f"tokens exactly", judged)


def _forced_gaps(forced: dict[str, Any], name: str) -> list[list[float]] | None:
    """A forced run's gaps per prompt for a workload, or None if it did not follow every token."""
    w = (forced.get("workloads") or {}).get(name)
    if not w or not all(p["followed"] and None not in p["gap"] for p in w["forced"]):
        return None
    return [p["gap"] for p in w["forced"]]


def judge_forced(scenario: str, tree: str, test: dict[str, Any], forced: dict[str, Any] | None,
                 calibration: dict[str, Any] | None, forced_calibration: dict[str, Any] | None) -> Judgement:
    """The `forced` oracle: every token of the test must be within the tolerance of the greedy choice
    of a plain decode forced along the test's own tokens (same model, same quantized KV cache, no
    speculation). The tolerance is max(TEACHER_TOL, NOISE_FACTOR x the noise), the noise being the
    largest gap of the same forced decode along the tokens of `calibration` (the plain engine run
    freely with other batching): what batch composition alone moves a correct token. It is taken
    over all the calibration's workloads, whichever workload is judged: the speculative engine
    computes even a lone request's tokens as rows of a (K+1)-row verify batch, and bf16 GEMMs of
    several rows round differently from one row's, which only a calibration workload of several
    requests shows. When the tolerance reaches the forced decode's median top-1/top-2 margin, it
    could not tell a wrong token from an ordinary choice, and the verdict is `invalid`."""
    def verdict(v: str, detail: str, workloads: list[WorkloadJudgement] | None = None) -> Judgement:
        return Judgement(scenario, tree, v, detail, workloads or [], _summary(test), _summary(forced or {}))

    if not test.get("booted") or test.get("error"):
        stage = "at boot" if not test.get("booted") else "while generating"
        return verdict("crash", f"{stage}: {_crash_text(test)}")
    for what, res in (("forced reference", forced), ("calibration", calibration),
                      ("forced calibration", forced_calibration)):
        if res is None or not res.get("booted") or res.get("error"):
            return verdict("invalid", f"{what} missing or crashed: {_crash_text(res or {})}")
    judged: list[WorkloadJudgement] = []
    noises = {name: _forced_gaps(forced_calibration, name) for name in calibration["workloads"]}
    if any(n is None for n in noises.values()):
        return verdict("invalid", "the forced calibration did not follow the tokens (or missed a score)")
    ref_max_gap = max((x for n in noises.values() for g in n for x in g), default=0.0)
    for name, ref in calibration["workloads"].items():
        got = test["workloads"].get(name, {"tokens": [], "tokens_per_s": None, "spec": {}})
        gaps = _forced_gaps(forced, name)
        if gaps is None:
            return verdict("invalid", f"{name}: the forced decode did not follow the tokens (or missed a score)")
        tolerance = max(TEACHER_TOL, NOISE_FACTOR * ref_max_gap)
        margins = sorted(m for p in forced["workloads"][name]["forced"] for m in p["margin"] if m is not None)
        mism = [first_mismatch(g, w) for g, w in zip(got["tokens"], ref["tokens"], strict=False)]
        judged.append(WorkloadJudgement(
            name=name, match=all(m is None for m in mism), first_mismatch=mism,
            ref_distinct=[len(set(t)) for t in got["tokens"]], tokens_per_s=got.get("tokens_per_s"),
            ref_tokens_per_s=ref.get("tokens_per_s"), spec=got.get("spec") or {}, tolerance=tolerance,
            off_greedy=[first_off_greedy(g, tolerance) for g in gaps],
            max_gap=max((x for g in gaps for x in g), default=0.0), ref_max_gap=ref_max_gap,
            ref_median_margin=margins[len(margins) // 2] if margins else None))
    degenerate = [w.name for w in judged if min(w.ref_distinct, default=0) < MIN_DISTINCT]
    if degenerate:
        return verdict("invalid", f"output too uniform in {', '.join(degenerate)} "
                                  f"(< {MIN_DISTINCT} distinct tokens in a prompt)", judged)
    return _judge_teacher(verdict, judged, reference="the forced plain decode")


def judge_memory(scenario: str, tree: str, test: dict[str, Any]) -> Judgement:
    """The `memory` oracle records a figure: the KV cache vLLM sized (its "GPU KV cache size" line);
    trees are compared side by side in the report. `crash` if the engine did not boot, with the size
    if it was logged before the crash (as when capture fails)."""
    tokens = test.get("kv_cache_tokens")
    size = "no KV cache size logged" if tokens is None else f"GPU KV cache size: {tokens:,} tokens"
    if test.get("kv_cache_gib") is not None:
        size += f" ({test['kv_cache_gib']} GiB)"
    if test.get("workspace_mb") is not None:
        size += (f"; workspace {test['workspace_mb']:,.1f} MB, {test['workspace_mb_profiled']:,.1f} MB of it "
                 "before the KV cache was sized")
        if test.get("workspace_grown_after"):
            size += " (grown after by " + ", ".join(test["workspace_grown_after"]) + ")"
    size += _memory_trace_text(test)
    if not test.get("booted") or test.get("error"):
        stage = "at boot" if not test.get("booted") else "while generating"
        return Judgement(scenario, tree, "crash", f"{size}; {stage}: {_crash_text(test)}", [], _summary(test), {})
    return Judgement(scenario, tree, "figure", size, [], _summary(test), {})


def _memory_trace_text(test: dict[str, Any]) -> str:
    """An Engine.memory_trace run in words: the profile's budget and its estimate of what torch holds, then each
    workload's peak of torch's allocator (reserved, then allocated), or the workload that failed."""
    profile = test.get("profile") or {}
    parts = []
    if profile:
        parts.append(f"budget {profile['requested_gib']:.2f} GiB, KV cache {profile['kv_cache_gib']:.2f} GiB, "
                     f"torch estimate {profile['torch_estimate_gib']:.2f} GiB")
    for name, w in test.get("workloads", {}).items():
        if "peak_reserved_gib" not in w:
            continue
        if "error" in w:
            parts.append(f"{name}: FAILED ({w['error'].get('type')}) at peak {w['peak_reserved_gib']:.2f} GiB")
            continue
        over = ""
        if profile.get("torch_estimate_gib"):
            over = f", {100 * (w['peak_reserved_gib'] / profile['torch_estimate_gib'] - 1):+.1f}% of the estimate"
        parts.append(f"{name}: peak {w['peak_reserved_gib']:.2f} GiB reserved ({w['peak_allocated_gib']:.2f} "
                     f"allocated{over}) in {w['seconds']:.0f} s")
    return "".join(f"; {p}" for p in parts)


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("booted", "boot_s", "cudagraph_mode", "error", "failure", "returncode", "kv_cache_tokens",
            "kv_cache_gib", "workspace_mb", "workspace_mb_profiled", "workspace_grown_after", "emulated",
            "jit_compiled_serving", "jit_after_first_request", "profile", "after_boot_gib")
    return {k: result[k] for k in keys if k in result}


def to_json(judgements: list[Judgement], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "meta": meta,
        "results": [
            {
                "scenario": j.scenario, "tree": j.tree, "verdict": j.verdict, "detail": j.detail,
                "test": j.test, "reference": j.reference,
                "workloads": [
                    {"name": w.name, "match": w.match, "first_mismatch": w.first_mismatch,
                     "ref_distinct": w.ref_distinct, "tokens_per_s": w.tokens_per_s,
                     "ref_tokens_per_s": w.ref_tokens_per_s, "spec": w.spec, "acceptance": w.acceptance,
                     "tolerance": w.tolerance, "off_greedy": w.off_greedy, "max_gap": w.max_gap,
                     "ref_max_gap": w.ref_max_gap,
                     "ref_median_margin": w.ref_median_margin, "logprob_mismatch": w.logprob_mismatch,
                     "max_logprob_diff": w.max_logprob_diff}
                    for w in j.workloads
                ],
            }
            for j in judgements
        ],
    }


def _fmt(x: float | None, pattern: str = "{:.0f}") -> str:
    return "-" if x is None else pattern.format(x)


def to_markdown(judgements: list[Judgement], meta: dict[str, Any]) -> str:
    lines = [f"# GPU scenarios: {meta.get('title', 'report')}", ""]
    for key in ("command", "device", "vllm", "bundle", "torch", "triton", "started", "wall_s"):
        if key in meta:
            lines.append(f"- {key}: `{meta[key]}`" if key == "command" else f"- {key}: {meta[key]}")
    lines += ["", "| scenario | tree | verdict | detail | workload | tok/s (ref) | acceptance | ref distinct "
                  "| max gap (ref) | tolerance | ref margin |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for j in judgements:
        detail = j.detail.replace("|", "\\|")
        if not j.workloads:
            lines.append(f"| {j.scenario} | {j.tree} | **{j.verdict}** | {detail} | | | | | | | |")
            continue
        for i, w in enumerate(j.workloads):
            head = f"| {j.scenario} | {j.tree} | **{j.verdict}** | {detail} " if i == 0 else "| | | | "
            lines.append(
                head + f"| {w.name} | {_fmt(w.tokens_per_s)} ({_fmt(w.ref_tokens_per_s)}) "
                f"| {_fmt(w.acceptance, '{:.2f}')} | {min(w.ref_distinct, default=0)} "
                f"| {_fmt(w.max_gap, '{:.3f}')} ({_fmt(w.ref_max_gap, '{:.3f}')}) | {_fmt(w.tolerance, '{:.2f}')} "
                f"| {_fmt(w.ref_median_margin, '{:.2f}')} |"
            )
    compiled = [(j, j.test.get("jit_compiled_serving")) for j in judgements if "jit_compiled_serving" in j.test]
    if compiled:
        lines += ["", "Kernels compiled after the engine's warm-up (vLLM's JIT monitor; engine under test):", ""]
        lines += [f"- {j.scenario} / {j.tree}: {', '.join(names)}" for j, names in compiled]
    strict = [(j, j.test["jit_after_first_request"]) for j in judgements if "jit_after_first_request" in j.test]
    if strict:
        lines += ["", "Kernels compiled after the first request (vLLM's JIT monitor in error mode from then on; "
                      "engine under test):", ""]
        lines += [f"- {j.scenario} / {j.tree}: "
                  + (names if isinstance(names, str) else ", ".join(names) or "none") for j, names in strict]
    lines.append("")
    return "\n".join(lines)
