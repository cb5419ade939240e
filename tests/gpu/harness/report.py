"""Judge engine results against their references and render JSON and markdown. Pure.

A scenario's verdict on one vLLM tree:
- `crash`: the engine under test did not boot or died while generating;
- `invalid`: the reference crashed, or its greedy output is too uniform to reveal a
  wrong result (fewer than MIN_DISTINCT distinct tokens for some prompt);
- `diverged`: booted, but some prompt's tokens differ from the reference's;
- `pass`: every prompt's tokens equal the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIN_DISTINCT = 8


@dataclass
class WorkloadJudgement:
    name: str
    match: bool
    first_mismatch: list[int | None]
    ref_distinct: list[int]
    tokens_per_s: float | None
    ref_tokens_per_s: float | None
    spec: dict[str, float] = field(default_factory=dict)

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


def judge(scenario: str, tree: str, test: dict[str, Any], reference: dict[str, Any]) -> Judgement:
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
        ))
    degenerate = [w.name for w in judged if min(w.ref_distinct, default=0) < MIN_DISTINCT]
    if degenerate:
        return verdict("invalid", f"reference output too uniform in {', '.join(degenerate)} "
                                  f"(< {MIN_DISTINCT} distinct tokens in a prompt)", judged)
    bad = [w for w in judged if not w.match]
    if bad:
        parts = [f"{w.name}: first mismatch per prompt {w.first_mismatch}" for w in bad]
        return verdict("diverged", "; ".join(parts), judged)
    return verdict("pass", "tokens equal the reference's", judged)


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("booted", "boot_s", "cudagraph_mode", "error", "failure", "returncode")
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
                     "ref_tokens_per_s": w.ref_tokens_per_s, "spec": w.spec, "acceptance": w.acceptance}
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
    lines += ["", "| scenario | tree | verdict | detail | workload | tok/s (ref) | acceptance | ref distinct |",
              "|---|---|---|---|---|---|---|---|"]
    for j in judgements:
        detail = j.detail.replace("|", "\\|")
        if not j.workloads:
            lines.append(f"| {j.scenario} | {j.tree} | **{j.verdict}** | {detail} | | | | |")
            continue
        for i, w in enumerate(j.workloads):
            head = f"| {j.scenario} | {j.tree} | **{j.verdict}** | {detail} " if i == 0 else "| | | | "
            lines.append(
                head + f"| {w.name} | {_fmt(w.tokens_per_s)} ({_fmt(w.ref_tokens_per_s)}) "
                f"| {_fmt(w.acceptance, '{:.2f}')} | {min(w.ref_distinct, default=0)} |"
            )
    lines.append("")
    return "\n".join(lines)
