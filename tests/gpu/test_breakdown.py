"""harness.breakdown: GPU time per step by stage, from a torch profiler trace.

The CPU side of the trace (steps and vLLM's scopes as user annotations, what ran inside them) is a real
profile taken here on the CPU; the GPU side (kernels sharing a correlation id with their launch, several
kernels behind one CUDA graph launch) follows kineto's chrome-trace schema, which a CPU cannot produce.
"""

from __future__ import annotations

import json

import pytest

from harness import breakdown
from harness.breakdown import STEP_PREFIX, kind_of, stage_of


def _x(cat, name, ts, dur, tid=1, pid=7, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid,
            **({"args": args} if args else {})}


def _trace() -> dict:
    """Two decode steps. Step 0: the forward launches a CUDA graph of attention, GDN and GEMM kernels (one
    correlation), the sampler launches a kernel and a copy, the drafter launches a graph of two kernels.
    Step 1 the same forward graph, with its attention twice as long. Around them: a kernel launched before the
    first step (no step: left out) and a launch in bookkeeping (another runner scope)."""
    ev = []
    corr = iter(range(100, 200))

    def launch(name, ts, kernels, tid=1):
        c = next(corr)
        ev.append(_x("cuda_runtime", name, ts, 2, tid=tid, correlation=c))
        for kname, kts, kdur, *cat in kernels:
            ev.append(_x(cat[0] if cat else "kernel", kname, kts, kdur, tid=7, pid=0, correlation=c))

    launch("cudaLaunchKernel", 5, [("early_kernel", 6, 50)])
    for step, t0, attn in ((0, 1000, 100.0), (1, 3000, 200.0)):
        ev.append(_x("user_annotation", f"{STEP_PREFIX}{step}", t0, 1500))
        ev.append(_x("user_annotation", "gpu_model_runner: forward", t0 + 10, 400))
        launch("cudaGraphLaunch", t0 + 20, [
            ("_tq_mq_verify_fwd", t0 + 100, attn), ("chunk_gated_delta_rule_fwd_h", t0 + 300, 50),
            ("nvjet_tst_128x64", t0 + 360, 40), ("fused_moe_kernel", t0 + 400, 30),
            ("triton_poi_fused_add_rms_norm", t0 + 430, 10)])
        ev.append(_x("user_annotation", "gpu_model_runner: sample", t0 + 420, 100))
        launch("cuLaunchKernel", t0 + 430, [("rejection_greedy_sample_kernel", t0 + 450, 20)])
        launch("cudaMemcpyAsync", t0 + 470, [("Memcpy DtoH (Device -> Pinned)", t0 + 480, 4, "gpu_memcpy")])
        ev.append(_x("user_annotation", "gpu_model_runner: draft", t0 + 530, 300))
        # a scope nested inside the draft scope: not a runner scope, so the draft scope is still innermost
        ev.append(_x("user_annotation", "mtp: propose", t0 + 540, 200))
        launch("cudaGraphLaunch", t0 + 550, [("_tq_decode_stage1", t0 + 560, 30), ("nvjet_tst_64x8", t0 + 600, 60)])
        ev.append(_x("user_annotation", "gpu_model_runner: bookkeep", t0 + 900, 50))
        launch("cudaLaunchKernel", t0 + 910, [("index_put_kernel", t0 + 920, 6)])
    # a launch on another thread inside a step's time: not inside that thread's step range, left out
    launch("cudaLaunchKernel", 1100, [("other_thread_kernel", 1150, 500)], tid=2)
    return {"traceEvents": ev}


def test_kinds_by_kernel_name():
    assert kind_of("_tq_mq_verify_fwd") == "attention"
    assert kind_of("chunk_gated_delta_rule_fwd_kernel_h_blockdim64") == "gdn"
    assert kind_of("_causal_conv1d_update_kernel") == "gdn"
    assert kind_of("fused_moe_kernel") == "moe"
    assert kind_of("nvjet_tst_192x8_64x5_2x1_v_bz_TNN") == "gemm"
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert kind_of("triton_poi_fused_add_mul_0") == "other"
    assert kind_of("Memcpy HtoD", "gpu_memcpy") == "copy"


def test_stages_by_scope():
    assert stage_of("gpu_model_runner: forward", "gdn") == "target gdn"
    assert stage_of("gpu_model_runner: draft", "attention") == "drafter attention"
    assert stage_of("gpu_model_runner: sample", "other") == "sampler and rejection"
    assert stage_of("gpu_model_runner: bookkeep", "other") == "runner, other scopes"
    assert stage_of(None, "gemm") == "outside the runner's scopes"


def test_breakdown_attributes_each_kernel_to_its_step_and_stage():
    got = breakdown.breakdown(_trace())
    assert got["steps"] == 2
    stages = got["stages"]
    assert stages["target attention"] == pytest.approx((0.1 + 0.2) / 2)
    assert stages["target gdn"] == pytest.approx(0.05)
    assert stages["target gemm"] == pytest.approx(0.04)
    assert stages["target moe"] == pytest.approx(0.03)
    assert stages["target other"] == pytest.approx(0.01)
    assert stages["sampler and rejection"] == pytest.approx(0.024)  # the kernel and the copy
    assert stages["drafter attention"] == pytest.approx(0.03)
    assert stages["drafter gemm"] == pytest.approx(0.06)
    assert stages["runner, other scopes"] == pytest.approx(0.006)
    assert "outside the runner's scopes" not in stages
    assert got["launches"] == 10  # 5 + 1 + 1 + 2 + 1 a step; the early and the other thread's left out
    assert got["kernel_ms"] == pytest.approx(sum(stages.values()))
    assert got["wall_ms"] == pytest.approx(1.5)
    assert got["kernels"][0]["name"] == "_tq_mq_verify_fwd"
    assert got["kernels"][0]["per_step"] == 1


def test_busy_time_is_the_union_of_overlapping_kernels():
    trace = _trace()
    # a second-stream kernel in step 0's forward graph, overlapping the attention kernel entirely
    corr = next(e for e in trace["traceEvents"] if e["name"] == "cudaGraphLaunch")["args"]["correlation"]
    trace["traceEvents"].append(_x("kernel", "gemv_overlapped", 1120, 50, tid=8, pid=0, correlation=corr))
    got = breakdown.breakdown(trace)
    assert got["kernel_ms"] > breakdown.breakdown(_trace())["kernel_ms"]
    assert got["gpu_ms"] == breakdown.breakdown(_trace())["gpu_ms"]


def test_host_side_ranks_each_scope_and_its_outermost_operators():
    """The CPU side: each runner scope's time per step, and in it the operators no other one contains (an
    attention op's own slices are its time, not listed beside it); a scope outside every step is left out."""
    trace = _trace()
    for t0 in (1000, 3000):
        trace["traceEvents"] += [_x("cpu_op", "vllm::unified_attention_with_output", t0 + 560, 120),
                                 _x("cpu_op", "aten::slice", t0 + 570, 10),
                                 _x("cpu_op", "aten::copy_", t0 + 700, 30),
                                 _x("cpu_op", "aten::index", t0 + 30, 40)]
    trace["traceEvents"].append(_x("user_annotation", "gpu_model_runner: draft", 9000, 5000))
    got = breakdown.breakdown(trace)["host"]
    assert got["scopes"]["gpu_model_runner: draft"] == pytest.approx(0.3)
    assert got["scopes"]["gpu_model_runner: forward"] == pytest.approx(0.4)
    draft = got["ops"]["gpu_model_runner: draft"]
    assert [(o["name"], o["ms"], o["per_step"]) for o in draft] == [
        ("vllm::unified_attention_with_output", 0.12, 1), ("aten::copy_", 0.03, 1)]
    assert [o["name"] for o in got["ops"]["gpu_model_runner: forward"]] == ["aten::index"]


def test_no_profiled_step_says_so():
    trace = {"traceEvents": [e for e in _trace()["traceEvents"] if not e["name"].startswith(STEP_PREFIX)]}
    assert breakdown.breakdown(trace)["steps"] == 0


def test_a_real_profile_s_annotations_enclose_what_ran_inside_them(tmp_path):
    """The CPU side of a real trace: the step's and the scope's ranges enclose the ops run inside them,
    innermost first, in the schema breakdown reads."""
    torch = pytest.importorskip("torch")
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, torch.profiler.record_function(f"{STEP_PREFIX}4"):
        with torch.profiler.record_function("gpu_model_runner: forward"):
            torch.ones(4).add_(1)
        torch.zeros(3).mul_(2)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    ops = [e for e in events if e["name"] in ("aten::add_", "aten::mul_")]
    assert {e["name"] for e in ops} == {"aten::add_", "aten::mul_"}
    steps = breakdown._enclosing(annotations, ops, lambda n: n.startswith(STEP_PREFIX))
    scopes = breakdown._enclosing(annotations, ops, lambda n: n.startswith("gpu_model_runner: "))
    named = {ops[i]["name"]: (steps.get(i, {}).get("name"), scopes.get(i, {}).get("name")) for i in range(len(ops))}
    assert named == {"aten::add_": (f"{STEP_PREFIX}4", "gpu_model_runner: forward"),
                     "aten::mul_": (f"{STEP_PREFIX}4", None)}


class _Request:
    def __init__(self, prompt: int) -> None:
        self.num_prompt_tokens = prompt
        self.num_computed_tokens = 0


class _Engine:
    """An engine's stepping as harness.serve sees it: each step advances the scheduler's requests (prefill
    chunks of up to 6 tokens, then one token a step), a request finishes 3 tokens past its prompt, and the step
    runs a torch op."""

    def __init__(self, prompts: list[int]) -> None:
        import types

        self.scheduler = types.SimpleNamespace(running=[_Request(p) for p in prompts], waiting=[])
        self.engine_core = types.SimpleNamespace(engine_core=types.SimpleNamespace(scheduler=self.scheduler))

    def step(self):
        import torch

        for r in self.scheduler.running:
            prefill = r.num_computed_tokens < r.num_prompt_tokens
            r.num_computed_tokens = min(r.num_prompt_tokens, r.num_computed_tokens + 6) if prefill \
                else r.num_computed_tokens + 1
        self.scheduler.running = [r for r in self.scheduler.running
                                  if r.num_computed_tokens < r.num_prompt_tokens + 3]
        torch.ones(2).add_(1)


def test_serve_profiles_only_steps_that_decode_the_whole_batch(tmp_path):
    """harness.serve.Steps: no profile during the prefill steps, the profile's ranges are the whole-batch decode
    steps, and it stops before the step in which the batch is no longer whole."""
    import types

    pytest.importorskip("torch")
    from harness.serve import Steps

    engine = _Engine([5, 5, 8])
    steps = Steps(types.SimpleNamespace(llm_engine=engine))
    steps.clear(3)
    steps.wanted = 50
    while engine.scheduler.running:
        engine.step()
    steps.stop()
    # computed tokens after each step: 0: 5, 5, 6 (prefills); 1: 6, 6, 8 (the long prompt's second chunk);
    # 2 and 3 decode the whole batch: 7, 7, 9 and 8, 8, 10, where two finish; 4: the last one alone.
    assert len(steps.durations) == 5
    assert len(steps.decoding) == 2
    path = tmp_path / "t.json"
    steps.finished.export_chrome_trace(str(path))
    names = {e["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "user_annotation"}
    assert names == {f"{STEP_PREFIX}2", f"{STEP_PREFIX}3"}
