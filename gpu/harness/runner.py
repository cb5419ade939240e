"""Run scenarios on one or more vLLM trees: each engine in its own subprocess with a
timeout, results cached per (tree, engine) so a run can be split over several calls
and a shared reference runs once."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import report
from .models import build
from .scenarios import Engine, Scenario

HARNESS_ROOT = Path(__file__).resolve().parent.parent
KV_CACHE_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
KV_MEMORY_LINE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
# VLLM_DEBUG_WORKSPACE=1: each growth of the workspace, with the caller that asked for it.
WORKSPACE_LINE = re.compile(r"Resized workspace from '([^']*)': ([\d.]+) MB -> ([\d.]+) MB")
# vLLM's JIT monitor (vllm/utils/jit_monitor.py, 0.25 and newer), active once the engine's warm-up is done: a
# kernel compiled while serving, logged once per kernel in its default "warn" mode.
JIT_LINE = re.compile(r"(\w+) (?:kernel JIT compilation|JIT compilation) during inference: ([\w<>]+(?:\.\w+)*)")


def memory_figures(log: str) -> dict[str, Any]:
    """What the engine's log says of its memory: the KV cache it sized (tokens, GiB) and the workspace, in
    MB: its size when the KV cache was sized (so inside the memory profile) and at the end, with the callers
    that grew it after. Also the kernels vLLM's JIT monitor saw compiled after the engine's warm-up."""
    figures: dict[str, Any] = {}
    sizes = KV_CACHE_LINE.findall(log)
    if sizes:
        figures["kv_cache_tokens"] = int(sizes[-1].replace(",", ""))
    memory = KV_MEMORY_LINE.search(log)
    if memory:
        figures["kv_cache_gib"] = float(memory.group(1))
    sized_at = memory.start() if memory else len(log)
    grows = [(m.start(), m.group(1), float(m.group(3))) for m in WORKSPACE_LINE.finditer(log)]
    if grows:
        before = [mb for at, _, mb in grows if at < sized_at]
        figures["workspace_mb_profiled"] = max(before, default=0.0)
        figures["workspace_mb"] = max(mb for _, _, mb in grows)
        figures["workspace_grown_after"] = sorted({who for at, who, _ in grows if at >= sized_at})
    compiled = sorted({f"{backend}:{name}" for backend, name in JIT_LINE.findall(log)})
    if compiled:
        figures["jit_compiled_serving"] = compiled
    return figures


def engine_digest(engine: Engine) -> str:
    return hashlib.sha256(engine.key().encode()).hexdigest()[:16]


def forced_digest(engine: Engine, follows: Engine) -> str:
    """A forced engine's result key: the engine and the one whose tokens it follows."""
    return f"{engine_digest(engine)}-{engine_digest(follows)}"


def _job(engine: Engine, model_dir: Path, force: dict[str, list[list[int]]] | None = None) -> dict[str, Any]:
    return {
        "model_dir": str(model_dir),
        "kwargs": engine.kwargs,
        "workloads": [asdict(w) for w in engine.workloads],
        "score": engine.score,
        "force": force,
        "logprobs": engine.logprobs,
        "jit_strict": engine.jit_strict,
        "memory_trace": engine.memory_trace,
    }


# A forced decode runs on the V1 model runner: harness.forcing's logits processor has V1's interface, and
# from vLLM 0.29 on Model Runner V2 (the default) loads only processors of its own class. (0.20 ignores it.)
FORCED_ENV: tuple[tuple[str, str], ...] = (("VLLM_USE_V2_MODEL_RUNNER", "0"),)


def _env(tree: Path, extra_path: list[Path], cache: Path,
         engine_env: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    env = {**os.environ, **dict(engine_env)}
    parts = [str(tree), str(HARNESS_ROOT), *map(str, extra_path)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    env.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def child_env(engine: Engine, tree: Path, extra_path: list[Path], cache: Path, forced: bool) -> dict[str, str]:
    """The environment of an engine's process; a forced decode's runs on the V1 model runner."""
    return _env(tree, extra_path, cache, engine.env + (FORCED_ENV if forced else ()))


def reap(group: int) -> None:
    """Kill whatever is left of process group ``group`` (an engine's process started with
    ``start_new_session``). An engine split over GPUs runs its workers in processes of its own; when the
    engine's process ends without shutting them down (``os._exit``, a crash, a timeout) they live on and keep
    their GPU memory, and the next engine on those GPUs runs out of it."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_engine(engine: Engine, tree: Path, model_dir: Path, out: Path, extra_path: list[Path],
               cache: Path, timeout: float, digest: str | None = None,
               force: dict[str, list[list[int]]] | None = None) -> dict[str, Any]:
    """Start one engine in a subprocess; return its result (a crash and a timeout are results)."""
    out.mkdir(parents=True, exist_ok=True)
    digest = digest or engine_digest(engine)
    job_file, result_file, log_file = (out / f"{digest}.{s}" for s in ("job.json", "json", "log"))
    job_file.write_text(json.dumps(_job(engine, model_dir, force)))
    result_file.unlink(missing_ok=True)
    env = child_env(engine, tree, extra_path, cache, forced=force is not None)
    started = time.perf_counter()
    with open(log_file, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "harness.child", str(job_file), str(result_file)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            reap(proc.pid)
            proc.wait()
    wall = round(time.perf_counter() - started, 1)
    if result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        tail = log_file.read_bytes()[-2000:].decode(errors="replace").strip().splitlines()
        why = f"timed out after {timeout:.0f} s" if code is None else f"exited {code} without a result"
        result = {"booted": False, "failure": f"{why}; last log line: {tail[-1] if tail else ''}"}
    result.update(returncode=code, wall_s=wall)
    # vLLM logs the KV cache it sized once memory profiling is done (also when a later step crashes).
    result.update(memory_figures(log_file.read_bytes().decode(errors="replace")))
    result_file.write_text(json.dumps(result))
    return result


def _forced_pairs(scenarios: list[Scenario]) -> list[tuple[Engine, Engine]]:
    """(forced engine, engine it follows) for every scenario judged by the forced oracle."""
    pairs = []
    for s in scenarios:
        if s.oracle == "forced":
            for follows in (s.test, s.calibration):
                if follows is not None and (s.reference, follows) not in pairs:
                    pairs.append((s.reference, follows))
    return pairs


def _tokens(result: dict[str, Any] | None) -> dict[str, list[list[int]]] | None:
    """The tokens of a free-running result to force, or None if it has none (it crashed)."""
    if not result or not result.get("booted") or result.get("error") or not result.get("workloads"):
        return None
    return {name: w["tokens"] for name, w in result["workloads"].items()}


def run(scenarios: list[Scenario], trees: dict[str, Path], work: Path, extra_path: list[Path],
        timeout: float = 420.0, jobs: int = 1, fresh: bool = False,
        log=print) -> dict[str, dict[str, dict[str, Any]]]:
    """Results by tree label, then engine digest (forced runs: forced_digest). Engines already run
    are reused unless fresh. Free-running engines run first, then the forced ones, which need the
    tokens of the engines they follow."""
    models = work / "models"
    engines = {engine_digest(e): e for s in scenarios for e in s.engines()
               if e is not None and not e.force}
    pairs = _forced_pairs(scenarios)
    dirs = {e.model.name: build(e.model, models)
            for e in [*engines.values(), *(f for f, _ in pairs)]}
    results: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in trees}

    def cached(label: str, digest: str) -> bool:
        done = work / "results" / label / f"{digest}.json"
        if done.exists() and not fresh:
            results[label][digest] = json.loads(done.read_text())
            return True
        return False

    def one(item):
        label, tree, digest, engine, force = item
        res = run_engine(engine, tree, dirs[engine.model.name], work / "results" / label, extra_path,
                         work / "cache", timeout, digest=digest, force=force)
        state = "booted" if res.get("booted") else "crashed"
        log(f"[{label}] {engine.model.name} {digest}: {state} in {res['wall_s']} s")
        return label, digest, res

    todo = [(label, tree, digest, engine, None) for label, tree in trees.items()
            for digest, engine in engines.items() if not cached(label, digest)]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for label, digest, res in pool.map(one, todo):
            results[label][digest] = res
        forced = []
        for label, tree in trees.items():
            for engine, follows in pairs:
                digest = forced_digest(engine, follows)
                tokens = _tokens(results[label].get(engine_digest(follows)))
                if tokens is not None and not cached(label, digest):
                    forced.append((label, tree, digest, engine, tokens))
        for label, digest, res in pool.map(one, forced):
            results[label][digest] = res
    return results


def judge_all(scenarios: list[Scenario], results: dict[str, dict[str, dict[str, Any]]]) -> list[report.Judgement]:
    out = []
    for scenario in scenarios:
        for label, by_digest in results.items():
            test = by_digest.get(engine_digest(scenario.test))
            if scenario.oracle == "forced":
                if test is None:
                    continue
                calibration = scenario.calibration
                if calibration is None:  # a probe: its gaps are in the results, not judged; its crash is reported
                    if not test.get("booted") or test.get("error"):
                        out.append(report.judge_forced(scenario.name, label, test, None, None, None))
                    continue
                out.append(report.judge_forced(
                    scenario.name, label, test,
                    by_digest.get(forced_digest(scenario.reference, scenario.test)),
                    None if calibration is None else by_digest.get(engine_digest(calibration)),
                    None if calibration is None else by_digest.get(forced_digest(scenario.reference, calibration))))
                continue
            ref = by_digest.get(engine_digest(scenario.reference))
            if test is None or ref is None:
                continue
            if scenario.oracle == "memory":
                out.append(report.judge_memory(scenario.name, label, test))
                continue
            control = None
            if scenario.control is not None:
                control = tuple(by_digest.get(engine_digest(e)) for e in scenario.control)
                if None in control:
                    continue
            out.append(report.judge(scenario.name, label, test, ref, oracle=scenario.oracle, control=control))
    return out


def load(scenarios: list[Scenario], trees: dict[str, Path], work: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """The results earlier runs left in work/results, for the report command."""
    results: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in trees}
    for label in trees:
        for scenario in scenarios:
            digests = [engine_digest(e) for e in scenario.engines()
                       if e is not None]
            digests += [forced_digest(f, t) for f, t in _forced_pairs([scenario])]
            for digest in digests:
                path = work / "results" / label / f"{digest}.json"
                if path.exists():
                    results[label][digest] = json.loads(path.read_text())
    return results
