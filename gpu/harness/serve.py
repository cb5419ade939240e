"""One engine kept alive for repeated timed runs: `python -m harness.serve JOB.json`.

Benchmarks compare configurations by interleaving their runs (A, B, C, A, B, C, ...), so that
drift of the GPU's clocks or of the host hits every configuration alike; that needs every engine
booted at once, each in its own process, waiting for the next run. This process boots the engine
of a harness job (`harness.child` builds the same LLM), prints `{"ready": ...}` on stdout, then
serves one command a line on stdin:

- `{"run": WORKLOAD, "batch": N, "min_seconds": S}`: generate the workload's first N prompts
  again and again until S seconds have passed (never less than one pass), and print
  `{"seconds": ..., "tokens": ..., "passes": ..., "steps": ..., "step_ms": ..., "spec": {...}}` (engine
  steps taken and their median duration);
- `{"weights": ALPHA}`: write harness.acceptance's controlled-acceptance weights at that alpha into the
  model (and its MTP drafter) and empty the prefix cache; print `{"weights": ...}`;
- `{"calibrate": WORKLOAD, "batch": N, "goal": G}`: find the alpha whose first-position acceptance over
  the workload's first N prompts is G (harness.acceptance.calibrate), leave those weights in, and print
  `{"alpha": ..., "probes": [[alpha, rate], ...]}`;
- `{"drafts": WORKLOAD, "batch": N}`: generate the workload's first N prompts once, recording every
  proposal of the speculator (harness.drafts), and print `{"tokens": [...], "drafts": [...]}`;
- `{"quit": true}`: exit.

Anything that goes wrong is printed as `{"error": ...}`; the controller reports it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _drafts(llm, sampling_params, workload: dict[str, Any], batch: int) -> dict[str, Any]:
    from harness import drafts

    if not drafts.install():
        return {"error": {"type": "drafts", "message": "no Model Runner V2 speculator to record", "at": None}}
    prompts = [{"prompt_token_ids": list(p)} for p in workload["prompts"][:batch]]
    params = sampling_params(temperature=0.0, max_tokens=workload["max_tokens"],
                             min_tokens=workload["max_tokens"], detokenize=False, ignore_eos=True)
    with drafts.recording() as log:
        outs = llm.generate(prompts, params, use_tqdm=False)
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs], "drafts": log}


def _timed_steps(llm) -> list[float]:
    """Record the duration of every engine step from now on (the list fills as `generate` runs)."""
    durations: list[float] = []
    engine = llm.llm_engine
    step = engine.step

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - t0)

    engine.step = timed
    return durations


def _set_weights(llm, alpha: float) -> dict[str, Any]:
    from harness import acceptance

    info = llm.collective_rpc(acceptance.set_weights, args=(alpha,))[0]
    llm.reset_prefix_cache()  # cached blocks hold the old model's KV
    return info


def _calibrate(llm, sampling_params, workload: dict[str, Any], batch: int, goal: float) -> dict[str, Any]:
    from harness import acceptance
    from harness.child import _spec_metrics, spec_delta

    prompts = [{"prompt_token_ids": list(p)} for p in workload["prompts"][:batch]]
    params = sampling_params(temperature=0.0, max_tokens=64, min_tokens=64, detokenize=False, ignore_eos=True)

    def measure() -> float:
        before = _spec_metrics(llm)
        llm.generate(prompts, params, use_tqdm=False)
        rate = acceptance.first_position_rate(spec_delta(before, _spec_metrics(llm)))
        if rate is None:
            raise RuntimeError("no drafts counted: is speculation on, and are the spec-decode metrics?")
        return rate

    alpha, probes = acceptance.calibrate(lambda a: _set_weights(llm, a), measure, goal)
    return {"alpha": alpha, "probes": [list(p) for p in probes]}


def main() -> None:
    import statistics

    from harness.child import _spec_metrics, _stub_structured_output, spec_delta, where

    job = json.loads(Path(sys.argv[1]).read_text())
    started = time.perf_counter()
    try:
        _stub_structured_output()
        from vllm.entrypoints.llm import LLM
        from vllm.sampling_params import SamplingParams

        llm = LLM(model=job["model_dir"], **job["kwargs"])
    except BaseException as exc:  # noqa: BLE001 - a crash at boot is a result
        _say({"error": where(exc), "traceback": traceback.format_exc()[-3000:]})
        os._exit(0)
    workloads = {w["name"]: w for w in job["workloads"]}
    steps = _timed_steps(llm)
    _say({"ready": True, "boot_s": round(time.perf_counter() - started, 1)})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        try:
            if "drafts" in cmd:
                _say(_drafts(llm, SamplingParams, workloads[cmd["drafts"]], cmd["batch"]))
                continue
            if "weights" in cmd:
                _say({"weights": _set_weights(llm, float(cmd["weights"]))})
                continue
            if "calibrate" in cmd:
                _say(_calibrate(llm, SamplingParams, workloads[cmd["calibrate"]], cmd["batch"], cmd["goal"]))
                continue
            w = workloads[cmd["run"]]
            prompts = [{"prompt_token_ids": list(p)} for p in w["prompts"][: cmd["batch"]]]
            params = SamplingParams(temperature=0.0, max_tokens=w["max_tokens"], min_tokens=w["max_tokens"],
                                    detokenize=False, ignore_eos=True)
            before = _spec_metrics(llm)
            steps.clear()
            tokens = passes = 0
            t0 = time.perf_counter()
            while passes == 0 or time.perf_counter() - t0 < cmd["min_seconds"]:
                outs = llm.generate(prompts, params, use_tqdm=False)
                tokens += sum(len(o.outputs[0].token_ids) for o in outs)
                passes += 1
            seconds = time.perf_counter() - t0
            after = _spec_metrics(llm)
            _say({"seconds": round(seconds, 4), "tokens": tokens, "passes": passes, "steps": len(steps),
                  "step_ms": round(1000 * statistics.median(steps), 3) if steps else None,
                  "spec": spec_delta(before, after)})
        except BaseException as exc:  # noqa: BLE001 - reported to the controller
            _say({"error": where(exc), "traceback": traceback.format_exc()[-3000:]})
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
