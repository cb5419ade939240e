"""One engine kept alive for repeated timed runs: `python -m harness.serve JOB.json`.

Benchmarks compare configurations by interleaving their runs (A, B, C, A, B, C, ...), so that
drift of the GPU's clocks or of the host hits every configuration alike; that needs every engine
booted at once, each in its own process, waiting for the next run. This process boots the engine
of a harness job (`harness.child` builds the same LLM), prints `{"ready": ...}` on stdout (with the GPU's
name and the torch, Triton and vLLM versions), then
serves one command a line on stdin:

- `{"run": WORKLOAD, "batch": N, "min_seconds": S}`: generate the workload's first N prompts
  again and again until S seconds have passed (never less than one pass), and print
  `{"seconds": ..., "tokens": ..., "passes": ..., "steps": ..., "step_ms": ..., "decode_step_ms": ...,
  "spec": {...}}` (engine steps taken, their median duration, and the median of those in which the whole
  batch decoded: no prefill, none finished);
- `{"profile": WORKLOAD, "batch": N, "steps": S}`: generate the workload's first N prompts once, profile up
  to S steps in which the whole batch decodes (torch profiler, kernels and the model runner's scopes) and
  print harness.breakdown's summary: GPU time per step by stage (target and drafter attention, GDN, MoE,
  matrix products, the rest; sampler and rejection), the busiest kernels;
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

import contextlib
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


def stack() -> dict[str, str]:
    """The torch and Triton versions of this process and, where CUDA is there, the GPU's name (under "device")."""
    import torch
    import triton

    found = {"torch": torch.__version__, "triton": triton.__version__}
    if torch.cuda.is_available():
        found["device"] = torch.cuda.get_device_name(0)
    return found


def platform() -> dict[str, str]:
    """What this engine runs on, for a benchmark's header: raw outputs kept in the repository must say the card
    and the stack that made them ("cpu" without a GPU)."""
    import importlib

    try:
        vllm = getattr(importlib.import_module("vllm"), "__version__", "?")
    except ImportError:  # the controller's own process, or a test without vLLM
        vllm = "not importable"
    return {"device": "cpu", **stack(), "vllm": vllm}


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


def _scheduler(llm):
    """The engine core's scheduler when the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    core = getattr(llm.llm_engine, "engine_core", None)
    return getattr(getattr(core, "engine_core", None), "scheduler", None)


class Steps:
    """Every engine step's duration from now on (the list fills as `generate` runs), which of them decoded the
    whole batch (every request of `batch` past its prompt, none waiting or finished), and, when asked, a torch
    profiler over the next such steps, each in a ``vp_step N`` range (harness.breakdown reads the trace)."""

    def __init__(self, llm) -> None:
        self.durations: list[float] = []
        self.decoding: list[float] = []
        self.batch: int | None = None
        self.wanted = 0
        self.profiler = None
        self.finished = None
        self._scheduler = _scheduler(llm)
        engine = llm.llm_engine
        step = engine.step

        def timed(*args, **kwargs):
            full = self._decodes_whole_batch()
            if self.profiler is not None and not full:
                self.stop()
            if self.profiler is None and full and self.wanted > 0:
                self._start()
            scope = contextlib.nullcontext()
            if self.profiler is not None:
                import torch

                scope = torch.profiler.record_function(f"vp_step {len(self.durations)}")
            t0 = time.perf_counter()
            try:
                with scope:
                    return step(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                self.durations.append(elapsed)
                if full:
                    self.decoding.append(elapsed)
                if self.profiler is not None:
                    self.wanted -= 1
                    if self.wanted <= 0:
                        self.stop()

        engine.step = timed

    def clear(self, batch: int | None) -> None:
        self.durations.clear()
        self.decoding.clear()
        self.batch = batch

    def profile_next(self, count: int) -> None:
        """Profile the next ``count`` whole-batch decode steps (``finished`` holds the profile once stopped)."""
        self.finished = None
        self.wanted = count

    def _decodes_whole_batch(self) -> bool:
        s = self._scheduler
        if s is None or self.batch is None:
            return False
        try:
            running = list(s.running)
            return (len(running) == self.batch and len(s.waiting) == 0
                    and all(r.num_computed_tokens >= r.num_prompt_tokens for r in running))
        except (AttributeError, TypeError):
            return False

    def _start(self) -> None:
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.start()

    def stop(self) -> None:
        if self.profiler is not None:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.profiler.stop()
            self.finished, self.profiler = self.profiler, None
            self.wanted = 0


def _profile(llm, steps: Steps, sampling_params, workload: dict[str, Any], batch: int, count: int,
             trace: Path) -> dict[str, Any]:
    """One pass of the workload's first ``batch`` prompts with up to ``count`` whole-batch decode steps
    profiled; harness.breakdown's summary of them."""
    from harness import scopes
    from harness.breakdown import breakdown

    scopes.install()  # Model Runner V2 opens no scopes of its own
    prompts = [{"prompt_token_ids": list(p)} for p in workload["prompts"][:batch]]
    params = sampling_params(temperature=0.0, max_tokens=workload["max_tokens"], min_tokens=workload["max_tokens"],
                             detokenize=False, ignore_eos=True)
    steps.clear(batch)
    steps.profile_next(count)
    with scopes.opened():
        llm.generate(prompts, params, use_tqdm=False)
    steps.stop()
    if steps.finished is None:
        return {"error": {"type": "profile", "message": "no step decoded the whole batch", "at": None}}
    steps.finished.export_chrome_trace(str(trace))
    summary = breakdown(json.loads(trace.read_text()))
    summary["trace_mb"] = round(trace.stat().st_size / 2**20, 1)
    return summary


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
    steps = Steps(llm)
    _say({"ready": True, "boot_s": round(time.perf_counter() - started, 1), **platform()})
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
            if "profile" in cmd:
                trace = Path(sys.argv[1]).with_name(f"trace-{cmd['profile']}-b{cmd['batch']}.json")
                _say(_profile(llm, steps, SamplingParams, workloads[cmd["profile"]], cmd["batch"],
                              cmd.get("steps", 12), trace))
                continue
            if "calibrate" in cmd:
                _say(_calibrate(llm, SamplingParams, workloads[cmd["calibrate"]], cmd["batch"], cmd["goal"]))
                continue
            w = workloads[cmd["run"]]
            prompts = [{"prompt_token_ids": list(p)} for p in w["prompts"][: cmd["batch"]]]
            params = SamplingParams(temperature=0.0, max_tokens=w["max_tokens"], min_tokens=w["max_tokens"],
                                    detokenize=False, ignore_eos=True)
            before = _spec_metrics(llm)
            steps.clear(cmd["batch"])
            tokens = passes = 0
            t0 = time.perf_counter()
            while passes == 0 or time.perf_counter() - t0 < cmd["min_seconds"]:
                outs = llm.generate(prompts, params, use_tqdm=False)
                tokens += sum(len(o.outputs[0].token_ids) for o in outs)
                passes += 1
            seconds = time.perf_counter() - t0
            after = _spec_metrics(llm)
            _say({"seconds": round(seconds, 4), "tokens": tokens, "passes": passes, "steps": len(steps.durations),
                  "step_ms": round(1000 * statistics.median(steps.durations), 3) if steps.durations else None,
                  "decode_step_ms": (round(1000 * statistics.median(steps.decoding), 3)
                                     if steps.decoding else None),
                  "spec": spec_delta(before, after)})
        except BaseException as exc:  # noqa: BLE001 - reported to the controller
            _say({"error": where(exc), "traceback": traceback.format_exc()[-3000:]})
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
