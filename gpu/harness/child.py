"""One engine in one process: start `vllm.LLM`, run the workloads, write a JSON result.

Run as `python -m harness.child JOB.json RESULT.json` with the vLLM under test first
on PYTHONPATH. Whatever happens, the result file says it: a crash is recorded with
the exception's last line and the innermost vLLM frame, so the parent can report it.
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


def _stub_structured_output() -> None:
    """llguidance and xgrammar serve structured output only; the bundle leaves them out."""
    import importlib.util
    import types

    def placeholder(attr: str) -> type:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {})

    for name in ("llguidance", "xgrammar"):
        if importlib.util.find_spec(name) is None:
            stub = types.ModuleType(name)
            stub.__getattr__ = placeholder  # type annotations at vLLM's import name their classes
            sys.modules[name] = stub


def where(exc: BaseException) -> dict[str, Any]:
    """The exception's type, last message line, raising frame and innermost vLLM frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    vllm_frames = [f for f in frames if f"{os.sep}vllm{os.sep}" in f.filename]
    last = frames[-1] if frames else None
    inner = vllm_frames[-1] if vllm_frames else last
    message = (str(exc).strip().splitlines() or [""])[-1]

    def short(frame) -> str | None:
        if frame is None:
            return None
        path = frame.filename
        if f"{os.sep}vllm{os.sep}" in path:
            path = "vllm/" + path.rsplit(f"{os.sep}vllm{os.sep}", 1)[1]
        return f"{path}:{frame.lineno} in {frame.name}"

    return {"type": type(exc).__name__, "message": message[:500], "at": short(inner), "raised": short(last)}


def _spec_metrics(llm) -> dict[str, Any]:
    values: dict[str, Any] = {}
    try:
        metrics = llm.get_metrics()
    except Exception:  # metrics are an extra; a failure here must not hide the run
        return {}
    for m in metrics:
        if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value"):
            values[m.name.removeprefix("vllm:spec_decode_")] = float(m.value)
        elif m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "values"):  # per draft position
            values[m.name.removeprefix("vllm:spec_decode_")] = [float(v) for v in m.values]
        elif m.name == "vllm:num_preemptions" and hasattr(m, "value"):
            values["preemptions"] = float(m.value)
    return values


def spec_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the spec-decode counters counted between two readings (the per-position one element-wise)."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, list):
            old = before.get(key) or [0.0] * len(value)
            out[key] = [a - b for a, b in zip(value, old, strict=False)]
        else:
            out[key] = value - before.get(key, 0.0)
    return out


def teacher_gaps(llm, sampling_params, prompts: list[list[int]], outputs: list[list[int]]) -> list[dict[str, list]]:
    """Score each output token against this engine's own greedy choice given the same prefix.

    Prompt and output go back in as one prompt (a prefill: no speculation, and prompt logprobs
    skip the prefix cache), asking for the top-2 logprobs at every position. Per output token:
    `gap`, the logprob of the top token minus that of the emitted one (0 when the emitted token
    is the greedy choice), and `margin`, top-1 minus top-2 (how decisive the choice was).
    """
    params = sampling_params(temperature=0.0, max_tokens=1, prompt_logprobs=2, detokenize=False)
    scored = llm.generate([{"prompt_token_ids": p + o} for p, o in zip(prompts, outputs, strict=True)], params,
                          use_tqdm=False)
    result = []
    for prompt, output, out in zip(prompts, outputs, scored, strict=True):
        gaps, margins = [], []
        for j, token in enumerate(output):
            entry = out.prompt_logprobs[len(prompt) + j]
            ranked = sorted((lp.logprob for lp in entry.values()), reverse=True)
            gaps.append(round(ranked[0] - entry[token].logprob, 5))
            margins.append(round(ranked[0] - ranked[1], 5) if len(ranked) > 1 else None)
        result.append({"gap": gaps, "margin": margins})
    return result


def emitted_logprobs(completion) -> list[float | None]:
    """The logprob of each token a completion emitted (None where vLLM gave none), as exact floats."""
    entries = completion.logprobs or []
    return [e[t].logprob if t in e else None for t, e in zip(completion.token_ids, entries, strict=False)] + \
        [None] * (len(completion.token_ids) - len(entries))


def staggered(llm, prompts: list[list[int]], params, arrivals: list[int]) -> list[Any]:
    """Each prompt's finished completion (tokens, logprobs), prompt i added through the engine's request
    API just before engine step `arrivals[i]` (steps counted from the first), so later requests join
    batches of requests that are already decoding."""
    engine = llm.llm_engine
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    index: dict[str, int] = {}
    done: dict[int, Any] = {}
    step = 0
    while order or engine.has_unfinished_requests():
        while order and arrivals[order[0]] <= step:
            i = order.pop(0)
            given = f"arrival-{i}"
            index[given] = i
            index[str(engine.add_request(given, {"prompt_token_ids": list(prompts[i])}, params))] = i
        for out in engine.step():
            if out.finished:
                done[index[out.request_id]] = out.outputs[0]
        step += 1
    return [done[i] for i in range(len(prompts))]


def emulate_budget(kwargs: dict[str, Any], gib: float) -> dict[str, Any]:
    """A smaller GPU's memory budget on this one: torch's allocations capped at `gib` (an allocation past it
    fails as on that card) and vLLM's gpu_memory_utilization (default 0.9) taken of `gib`, not of the whole
    device. Memory outside torch's allocator (the CUDA context, NCCL) is not capped."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    utilization = kwargs.get("gpu_memory_utilization", 0.9)
    kwargs["gpu_memory_utilization"] = round(utilization * fraction, 6)
    return {"gib": gib, "utilization": utilization, "device_total": total}


def run(job: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"booted": False, "workloads": {}}
    started = time.perf_counter()
    try:
        _stub_structured_output()
        import vllm

        # Imported from their modules: vllm's lazy __getattr__ turns an import failure into
        # "cannot import name", hiding the cause.
        from vllm.entrypoints.llm import LLM
        from vllm.sampling_params import SamplingParams

        result["vllm_file"] = vllm.__file__
        kwargs = dict(job["kwargs"])
        if job.get("force"):
            from harness.forcing import ForceTokens

            kwargs["logits_processors"] = [ForceTokens]
        if os.environ.get("VP_EMULATE_GPU_GIB"):
            result["emulated"] = emulate_budget(kwargs, float(os.environ["VP_EMULATE_GPU_GIB"]))
        llm = LLM(model=job["model_dir"], **kwargs)
    except BaseException as exc:  # noqa: BLE001 - a crash at boot is a result
        result["error"] = where(exc)
        result["traceback"] = traceback.format_exc()[-4000:]
        result["boot_s"] = round(time.perf_counter() - started, 1)
        return result
    result["booted"] = True
    result["boot_s"] = round(time.perf_counter() - started, 1)
    try:
        config = llm.llm_engine.vllm_config.compilation_config
        result["cudagraph_mode"] = str(config.cudagraph_mode)
    except Exception:  # informational only
        pass
    if job.get("force"):
        return _run_forced(llm, SamplingParams, job, result)
    if job.get("memory_trace"):
        return memory_trace(llm, SamplingParams, job, result)
    try:
        # Warm-up: each workload on other prompts (reversed, so no prefix-cache hit; a repeating
        # prompt still repeats, so drafts get accepted), at full length: Triton JIT of every
        # kernel variant the workload reaches and lazy initialisation stay out of the timings.
        # With jit_strict, one request alone, then no kernel may compile (strict_jit_after_warmup).
        warmups = [{"prompts": w["prompts"][:1], "max_tokens": w["max_tokens"]} for w in job["workloads"][:1]] \
            if job.get("jit_strict") else job["workloads"]
        for w in warmups:
            llm.generate([{"prompt_token_ids": list(reversed(p))} for p in w["prompts"]],
                         SamplingParams(temperature=0.0, max_tokens=w["max_tokens"], detokenize=False,
                                        ignore_eos=True), use_tqdm=False)
        result["warmup_s"] = round(time.perf_counter() - started - result["boot_s"], 1)
        if job.get("jit_strict"):
            result["jit_after_first_request"] = strict_jit_after_warmup()
        for w in job["workloads"]:
            params = SamplingParams(temperature=0.0, max_tokens=w["max_tokens"], min_tokens=w["max_tokens"],
                                    detokenize=False, ignore_eos=True,
                                    **({"logprobs": 0} if job.get("logprobs") else {}))
            before = _spec_metrics(llm)
            t0 = time.perf_counter()
            if w.get("arrivals"):
                completions = staggered(llm, w["prompts"], params, w["arrivals"])
            else:
                outs = llm.generate([{"prompt_token_ids": list(p)} for p in w["prompts"]], params, use_tqdm=False)
                completions = [o.outputs[0] for o in outs]
            seconds = time.perf_counter() - t0
            after = _spec_metrics(llm)
            tokens = [list(c.token_ids) for c in completions]
            result["workloads"][w["name"]] = {
                "tokens": tokens,
                "seconds": round(seconds, 4),
                "tokens_per_s": round(sum(map(len, tokens)) / seconds, 1) if seconds else None,
                "spec": spec_delta(before, after),
            }
            if job.get("logprobs"):
                result["workloads"][w["name"]]["logprobs"] = [emitted_logprobs(c) for c in completions]
            if job.get("score"):
                result["workloads"][w["name"]]["teacher"] = teacher_gaps(
                    llm, SamplingParams, [list(p) for p in w["prompts"]], tokens)
    except BaseException as exc:  # noqa: BLE001 - a crash while generating is a result
        result["error"] = where(exc)
        result["traceback"] = traceback.format_exc()[-4000:]
    return result


GIB = 2**30


def _profile(llm) -> dict[str, float]:
    """What vLLM's memory profile decided, in GiB, read from the worker in this process (one GPU, no engine
    process): the memory it was given (gpu_memory_utilization of the device), the KV cache it sized, and its
    estimate of what torch holds at most while serving (the budget less the memory outside torch's allocator it
    measured). Empty where the worker is not reachable that way."""
    try:
        worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
        requested = worker.requested_memory
        kv = worker.available_kv_cache_memory_bytes
        non_torch = worker.non_torch_memory
    except AttributeError:
        return {}
    return {"requested_gib": round(requested / GIB, 3), "kv_cache_gib": round(kv / GIB, 3),
            "torch_estimate_gib": round((requested - non_torch) / GIB, 3)}


def memory_trace(llm, sampling_params, job: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Each workload in order, without warm-up, with the peak of torch's allocator over it (allocated and
    reserved, GiB): what a user's first long prompt meets. The first failure (an out-of-memory error) is recorded
    on its workload and ends the run: the engine is not trusted after it."""
    import torch

    result["profile"] = _profile(llm)
    result["after_boot_gib"] = {"allocated": round(torch.cuda.memory_allocated() / GIB, 3),
                                "reserved": round(torch.cuda.memory_reserved() / GIB, 3)}
    for w in job["workloads"]:
        params = sampling_params(temperature=0.0, max_tokens=w["max_tokens"], min_tokens=w["max_tokens"],
                                 detokenize=False, ignore_eos=True)
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        entry: dict[str, Any] = {}
        try:
            outs = llm.generate([{"prompt_token_ids": list(p)} for p in w["prompts"]], params, use_tqdm=False)
            entry["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
        except BaseException as exc:  # noqa: BLE001 - running out of memory is the result
            entry["error"] = where(exc)
            result["error"] = entry["error"]
            result["traceback"] = traceback.format_exc()[-4000:]
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        entry["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
        entry["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)
        result["workloads"][w["name"]] = entry
        if "error" in entry:
            break
    return result


def strict_jit_after_warmup() -> list[str] | str:
    """From now on any Triton kernel compiled in this process is recorded and fails the request that compiles it:
    vLLM's own JIT monitor (vllm/utils/jit_monitor.py, 0.25 and newer), active since the engine's warm-up, switched
    to its error mode, with a hook in front of it that records the kernel's name. The engine's worker runs in this
    process (VLLM_ENABLE_V1_MULTIPROCESSING=0, one GPU). Returns the live record, or why there is none.
    VP_JIT_RECORD=1 keeps the monitor's mode: every kernel compiled after the first request is recorded (and, with
    the engine's jit_monitor_verbose, logged with its specialization), for finding what a strict run stopped at."""
    try:
        from triton import knobs
        from vllm.utils import jit_monitor
    except ImportError as exc:
        return f"no JIT monitor: {exc}"
    if not jit_monitor.is_active():
        return "the JIT monitor is not active in this process"
    compiled: list[str] = []
    monitor = knobs.runtime.jit_post_compile_hook

    def record(**kwargs):
        compiled.append(getattr(kwargs.get("fn"), "name", "<unknown>"))
        return monitor(**kwargs)

    if os.environ.get("VP_JIT_RECORD") != "1":  # VP_JIT_RECORD=1: record every compile, raise on none
        jit_monitor._mode = "error"
    knobs.runtime.jit_post_compile_hook = record
    return compiled


def _run_forced(llm, sampling_params, job: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Decode each workload's prompts forced to follow the given tokens, scoring every step."""
    from harness.forcing import FORCE_KEY, forced_gaps

    try:
        for w in job["workloads"]:
            forced = job["force"].get(w["name"])
            if forced is None:
                continue
            params = [sampling_params(temperature=0.0, max_tokens=max(1, len(t)), min_tokens=max(1, len(t)),
                                      logprobs=20, detokenize=False, ignore_eos=True,
                                      extra_args={FORCE_KEY: list(t)}) for t in forced]
            outs = llm.generate([{"prompt_token_ids": list(p)} for p in w["prompts"]], params, use_tqdm=False)
            result["workloads"][w["name"]] = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                                              "forced": forced_gaps(outs, forced)}
    except BaseException as exc:  # noqa: BLE001 - a crash while generating is a result
        result["error"] = where(exc)
        result["traceback"] = traceback.format_exc()[-4000:]
    return result


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    result = run(job)
    Path(sys.argv[2]).write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's engine threads can keep an interpreter alive past the end of main.
    os._exit(0)


if __name__ == "__main__":
    main()
