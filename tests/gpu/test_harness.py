"""The harness's pure parts: judging results, selecting scenarios, slimming and splitting
the bundle. The GPU runs themselves happen on a GPU host (gpu/host.sh)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import models, report
from harness.runner import _env, child_env, engine_digest
from harness.scenarios import BY_NAME, PROBES, SCENARIOS, prompts, select

VARIED = [list(range(10, 42)), list(range(20, 52))]


def result(tokens=VARIED, booted=True, error=None, spec=None) -> dict:
    out = {"booted": booted, "workloads": {"w": {"tokens": tokens, "tokens_per_s": 100.0, "spec": spec or {}}}}
    if error:
        out["error"] = error
    return out


def test_first_mismatch():
    assert report.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert report.first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert report.first_mismatch([1, 2], [1, 2, 3]) == 2


def test_pass_when_tokens_equal():
    j = report.judge("s", "t", result(), result())
    assert j.verdict == "pass"
    assert j.workloads[0].ref_distinct == [32, 32]


def test_diverged_names_the_first_mismatch_per_prompt():
    changed = [VARIED[0], VARIED[1][:5] + [0] + VARIED[1][6:]]
    j = report.judge("s", "t", result(changed), result())
    assert j.verdict == "diverged"
    assert j.workloads[0].first_mismatch == [None, 5]
    assert "[None, 5]" in j.detail


def test_crash_at_boot_is_reported_with_its_place():
    err = {"type": "RuntimeError", "message": "Cannot copy", "at": "vllm/x.py:570 in f"}
    j = report.judge("s", "t", {"booted": False, "error": err}, result())
    assert j.verdict == "crash"
    assert "at boot" in j.detail and "vllm/x.py:570" in j.detail


def test_a_process_that_died_without_a_result_is_a_crash():
    j = report.judge("s", "t", {"booted": False, "failure": "exited -11 without a result"}, result())
    assert j.verdict == "crash" and "-11" in j.detail


def test_degenerate_reference_makes_the_scenario_invalid():
    flat = [[7] * 32, [7, 8] * 16]
    j = report.judge("s", "t", result(flat), result(flat))
    assert j.verdict == "invalid"


def test_reference_crash_makes_the_scenario_invalid():
    j = report.judge("s", "t", result(), {"booted": False, "error": {"type": "E", "message": "m", "at": "a"}})
    assert j.verdict == "invalid"


def test_acceptance_from_spec_counters():
    j = report.judge("s", "t", result(spec={"num_draft_tokens": 40.0, "num_accepted_tokens": 10.0}), result())
    assert j.workloads[0].acceptance == pytest.approx(0.25)


def test_markdown_and_json_carry_every_judgement():
    js = [report.judge("s1", "unpatched", {"booted": False, "failure": "x"}, result()),
          report.judge("s1", "patched", result(), result())]
    md = report.to_markdown(js, {"title": "t", "command": "python -m harness run"})
    assert "| s1 | unpatched | **crash**" in md and "| s1 | patched | **pass**" in md
    data = json.loads(json.dumps(report.to_json(js, {})))
    assert [r["verdict"] for r in data["results"]] == ["crash", "pass"]


def test_select_by_prefix_and_unknown_name():
    assert [s.name for s in select("a")] == [s.name for s in SCENARIOS if s.name.startswith("a-")]
    assert select(None) == list(SCENARIOS)
    assert [s.name for s in select("f-hybrid-tq-k8v4-mtp3-bfloat16")] == [
        "f-hybrid-tq-k8v4-mtp3-bfloat16", "f-hybrid-tq-k8v4-mtp3-bfloat16-99KiB"]
    assert [s.name for s in select("=f-hybrid-tq-k8v4-mtp3-bfloat16,=g-hybrid-preempt-mtp3")] == [
        "f-hybrid-tq-k8v4-mtp3-bfloat16", "g-hybrid-preempt-mtp3"]
    with pytest.raises(ValueError):
        select("=f-hybrid")
    with pytest.raises(ValueError, match="no scenario named"):
        select("zz")


def test_scenarios_are_well_formed():
    for s in SCENARIOS:
        vocab = s.test.model.config["vocab_size"]
        assert s.test.model == s.reference.model
        assert [w.name for w in s.test.workloads] == [w.name for w in s.reference.workloads]
        assert all(0 <= t < vocab for w in s.test.workloads for p in w.prompts for t in p)
        # The memory scenarios record one engine's figure on each tree.
        assert (engine_digest(s.test) == engine_digest(s.reference)) == (s.oracle == "memory")
        if s.oracle == "forced":
            assert s.reference.force and not s.test.force and s.calibration is not None
            # A plain decode (no speculation) that differs from the test by speculation or by graphs.
            assert "speculative_config" not in s.reference.kwargs
            assert "speculative_config" in s.test.kwargs or s.reference.kwargs.get("compilation_config") == {
                "cudagraph_mode": "NONE"} != s.test.kwargs.get("compilation_config")
            assert s.reference.kwargs.get("kv_cache_dtype") == s.test.kwargs.get("kv_cache_dtype")
    assert len({len(p) for p in prompts(64)}) == 4


def test_twin_scenarios_differ_from_their_reference_by_graph_mode_alone():
    twins = [s for s in SCENARIOS if s.oracle == "twin"]
    assert {"t-hybrid-tq-3bit_nc-mtp3-long", "t-hybrid-tq-3bit_nc-mtp3-long-99KiB",
            "t-hybrid-tq-4bit_nc-mtp3-arrivals", "t-tq-k8v4-decode-graphs"} <= {s.name for s in twins}
    for s in twins:
        assert s.test.logprobs and s.reference.logprobs and s.calibration is None
        assert "compilation_config" not in s.test.kwargs  # vLLM's default: FULL_AND_PIECEWISE
        assert s.reference.kwargs == {**s.test.kwargs, "compilation_config": {"cudagraph_mode": "PIECEWISE"}}
        assert s.reference.env == s.test.env and s.reference.workloads == s.test.workloads
        assert engine_digest(s.test) != engine_digest(dataclasses.replace(s.test, logprobs=False))
        twinned = BY_NAME.get(s.name.replace("t-", "h-" if "long" in s.name else "i-" if "arrivals" in s.name
                                             else "f-" if "hybrid" in s.name else "e-", 1))
        if twinned is None:  # the control: no scenario of its own
            assert "kv_cache_dtype" not in s.test.kwargs
            continue
        kwargs = {**twinned.test.kwargs, "attention_config": s.test.kwargs["attention_config"]}
        assert dataclasses.replace(s.test, logprobs=False) == dataclasses.replace(twinned.test, kwargs=kwargs)
    # The consumer-tile twin caps the split count, which both twins reach.
    consumer = BY_NAME["t-hybrid-tq-3bit_nc-mtp3-long-99KiB"]
    assert consumer.test.kwargs["attention_config"]["tq_max_kv_splits_for_cuda_graph"] == 16


def twin_result(tokens=VARIED, logprobs=None) -> dict:
    out = result(tokens)
    out["workloads"]["w"]["logprobs"] = logprobs or [[-0.5 - i / 64 for i in range(len(t))] for t in tokens]
    return out


def test_twin_oracle_passes_bit_identical_runs_only():
    assert report.judge("s", "t", twin_result(), twin_result(), oracle="twin").verdict == "pass"
    nudged = twin_result()["workloads"]["w"]["logprobs"]
    nudged[1][7] = nudged[1][7] + 1e-7
    j = report.judge("s", "t", twin_result(logprobs=nudged), twin_result(), oracle="twin")
    assert j.verdict == "diverged" and j.workloads[0].match
    assert j.workloads[0].logprob_mismatch == [None, 7]
    assert 0 < j.workloads[0].max_logprob_diff < 1e-6


def test_twin_oracle_names_the_first_difference_before_the_tokens_part():
    changed = [VARIED[0], VARIED[1][:20] + [7] * 12]
    logprobs = twin_result()["workloads"]["w"]["logprobs"]
    logprobs[1][18] -= 0.25
    j = report.judge("s", "t", twin_result(changed, logprobs), twin_result(), oracle="twin")
    assert j.verdict == "diverged"
    assert j.workloads[0].first_mismatch == [None, 20] and j.workloads[0].logprob_mismatch == [None, 18]
    assert j.workloads[0].max_logprob_diff == pytest.approx(0.25)


def test_twin_oracle_with_a_control_allows_what_graphs_change_by_themselves():
    def differing_at(first):
        out = twin_result()
        lps = out["workloads"]["w"]["logprobs"]
        for prompt, index in enumerate(first):
            if index is not None:
                lps[prompt][index] += 0.01
        return out
    control = (differing_at([None, 5]), twin_result())
    # Where the control differs, or later: what FULL graphs change without the backend under test.
    for first in ([None, 5], [None, 9], [None, None]):
        j = report.judge("s", "t", differing_at(first), twin_result(), oracle="twin", control=control)
        assert j.verdict == "pass", (first, j.detail)
    # Earlier than the control, or where it does not differ at all.
    for first in ([None, 4], [3, 5]):
        j = report.judge("s", "t", differing_at(first), twin_result(), oracle="twin", control=control)
        assert j.verdict == "diverged" and "before the control" in j.detail, first
    crashed = ({"booted": False, "failure": "x"}, twin_result())
    assert report.judge("s", "t", twin_result(), twin_result(), oracle="twin", control=crashed).verdict == "invalid"


def test_the_decode_graph_twin_is_judged_against_its_control():
    s = BY_NAME["t-tq-k8v4-decode-graphs"]
    control_test, control_ref = s.control
    twin_control = BY_NAME["t-bf16-decode-graphs"]
    assert (control_test, control_ref) == (twin_control.test, twin_control.reference)
    assert "kv_cache_dtype" not in control_test.kwargs
    assert {k: v for k, v in s.test.kwargs.items() if k != "kv_cache_dtype"} == control_test.kwargs
    assert control_test in s.engines() and control_ref in s.engines()


def test_twin_oracle_without_logprobs_is_invalid():
    assert report.judge("s", "t", result(), twin_result(), oracle="twin").verdict == "invalid"


def test_gdn_scenarios_share_one_reference_per_dtype():
    refs = {engine_digest(s.reference) for s in SCENARIOS if s.name[0] in "cd"}
    assert len(refs) == 2


def scored(tokens=VARIED, gaps=None, margin=2.0) -> dict:
    out = result(tokens)
    gaps = gaps or [[0.0] * len(t) for t in tokens]
    out["workloads"]["w"]["teacher"] = [{"gap": g, "margin": [margin] * len(g)} for g in gaps]
    return out


def test_teacher_oracle_passes_a_near_tie_flip():
    flipped = [VARIED[0], VARIED[1][:7] + [99] * 25]
    gaps = [[0.0] * 32, [0.0] * 7 + [0.02] + [0.0] * 24]
    j = report.judge("s", "t", scored(flipped, gaps), scored(), oracle="teacher")
    assert j.verdict == "pass"
    assert "1/2 prompts equal" in j.detail
    assert j.workloads[0].off_greedy == [None, None]


def test_teacher_oracle_names_the_first_token_off_the_greedy_choice():
    gaps = [[0.0] * 32, [0.0] * 13 + [1.5] + [0.0] * 18]
    j = report.judge("s", "t", scored(gaps=gaps), scored(), oracle="teacher")
    assert j.verdict == "diverged"
    assert j.workloads[0].off_greedy == [None, 13]
    assert j.workloads[0].max_gap == pytest.approx(1.5)


def test_teacher_tolerance_follows_the_references_own_noise():
    noisy_ref = scored(gaps=[[0.0] * 32, [0.5] + [0.0] * 31])  # correct tokens, 0.5 nats of rounding noise
    within = scored(gaps=[[0.0] * 32, [0.0] * 5 + [0.9] + [0.0] * 26])
    j = report.judge("s", "t", within, noisy_ref, oracle="teacher")
    assert j.verdict == "pass" and j.workloads[0].tolerance == pytest.approx(2 * 0.5)
    beyond = scored(gaps=[[0.0] * 32, [0.0] * 5 + [1.2] + [0.0] * 26])
    j = report.judge("s", "t", beyond, noisy_ref, oracle="teacher")
    assert j.verdict == "diverged" and j.workloads[0].off_greedy == [None, 5]


def test_teacher_oracle_is_invalid_when_the_noise_reaches_the_margins():
    noisy = scored(gaps=[[0.0] * 32, [1.0] + [0.0] * 31], margin=2.0)  # tolerance 2.0 >= median margin 2.0
    j = report.judge("s", "t", scored(), noisy, oracle="teacher")
    assert j.verdict == "invalid" and "too noisy to judge" in j.detail


def test_teacher_oracle_without_scores_is_invalid():
    j = report.judge("s", "t", result(), result(), oracle="teacher")
    assert j.verdict == "invalid"


def test_gdn_scenarios_score_both_engines():
    for s in SCENARIOS:
        if s.oracle == "teacher":
            assert s.test.score and s.reference.score


def forced_run(gaps, followed=True, margin=2.0) -> dict:
    return {"booted": True, "workloads": {"w": {"tokens": VARIED, "forced": [
        {"gap": g, "margin": [margin] * len(g), "followed": followed} for g in gaps]}}}


ZERO = [[0.0] * 32, [0.0] * 32]


def judge_forced(gaps, noise=ZERO, followed=True, margin=2.0):
    return report.judge_forced("s", "t", result(), forced_run(gaps, followed, margin), result(),
                               forced_run(noise, margin=margin))


def test_forced_oracle_passes_within_the_batching_noise():
    j = judge_forced([[0.0] * 32, [0.0] * 3 + [0.3] + [0.0] * 28], noise=[[0.2] + [0.0] * 31, [0.0] * 32])
    assert j.verdict == "pass" and j.workloads[0].tolerance == pytest.approx(0.4)
    assert "forced plain decode" in j.detail


def test_forced_oracle_names_the_first_wrong_token():
    """What a wrong verify result looks like: one token 20 nats below the plain decode's choice."""
    j = judge_forced([[0.0] * 32, [0.0] * 17 + [20.0] + [0.0] * 14])
    assert j.verdict == "diverged"
    assert j.workloads[0].off_greedy == [None, 17] and j.workloads[0].max_gap == pytest.approx(20.0)


def forced_two(gaps_a, gaps_b, noise_a, noise_b, margin=10.0) -> report.Judgement:
    """Two workloads: `a` (a lone request) and `b` (a batch of several)."""
    def run(a, b):
        return {"booted": True, "workloads": {
            name: {"tokens": VARIED, "forced": [{"gap": g, "margin": [margin] * len(g), "followed": True}
                                                for g in gaps]}
            for name, gaps in (("a", a), ("b", b))}}
    calib = {"booted": True, "workloads": {"a": {"tokens": VARIED}, "b": {"tokens": VARIED}}}
    return report.judge_forced("s", "t", {"booted": True, "workloads": {"a": {"tokens": VARIED},
                                                                         "b": {"tokens": VARIED}}},
                               run(gaps_a, gaps_b), calib, run(noise_a, noise_b))


def test_forced_noise_is_taken_over_every_calibration_workload():
    """A lone request's tokens come from multi-row verify batches: the noise of the batched
    calibration workload (1.0 here) bounds them too, so 0.5 passes and 4.5 does not."""
    quiet = [[0.0] * 32, [0.0] * 32]
    noisy = [[1.0] + [0.0] * 31, [0.0] * 32]
    ok = forced_two([[0.0] * 20 + [0.5] + [0.0] * 11, [0.0] * 32], quiet, quiet, noisy)
    assert ok.verdict == "pass"
    assert [w.tolerance for w in ok.workloads] == [pytest.approx(2.0), pytest.approx(2.0)]
    bad = forced_two([[0.0] * 5 + [4.5] + [0.0] * 26, [0.0] * 32], quiet, quiet, noisy)
    assert bad.verdict == "diverged" and bad.workloads[0].off_greedy == [5, None]


def test_forced_oracle_is_invalid_when_the_forcing_failed():
    assert judge_forced(ZERO, followed=False).verdict == "invalid"
    j = report.judge_forced("s", "t", result(), None, result(), forced_run(ZERO))
    assert j.verdict == "invalid" and "forced reference" in j.detail


def test_forced_oracle_is_invalid_when_the_noise_reaches_the_margins():
    assert judge_forced(ZERO, noise=[[1.0] + [0.0] * 31, [0.0] * 32], margin=2.0).verdict == "invalid"


def test_forced_oracle_reports_a_crashed_test():
    crashed = {"booted": False, "error": {"type": "NotImplementedError", "message": "hybrid", "at": "x.py:1"}}
    j = report.judge_forced("s", "t", crashed, None, result(), forced_run(ZERO))
    assert j.verdict == "crash" and "at boot" in j.detail


def test_memory_oracle_records_the_kv_cache_size_even_after_a_crash():
    j = report.judge_memory("m", "t", {"booted": True, "kv_cache_tokens": 1210000, "workloads": {}})
    assert j.verdict == "figure" and "1,210,000 tokens" in j.detail
    crashed = {"booted": False, "kv_cache_tokens": 836000, "failure": "capture"}
    assert "836,000" in report.judge_memory("m", "t", crashed).detail


def test_forced_runs_follow_the_test_and_the_calibration():
    from harness.runner import _forced_pairs

    s = BY_NAME["f-hybrid-tq-k8v4-ngram3-bfloat16"]
    assert _forced_pairs([s]) == [(s.reference, s.test), (s.reference, s.calibration)]
    assert _forced_pairs([BY_NAME["c-gdn-ngram3"]]) == []


def test_a_probe_that_crashes_is_reported_and_one_that_runs_is_not_judged():
    from harness.runner import judge_all

    probe = BY_NAME["x-single-llama-uq"]
    crashed = {"booted": False, "workloads": {},
               "error": {"type": "ValueError", "message": "kv_cache_dtype not supported"}}
    results = {"release": {engine_digest(probe.test): crashed}, "line": {engine_digest(probe.test): result()}}
    [j] = judge_all([probe], results)
    assert (j.scenario, j.tree, j.verdict) == ("x-single-llama-uq", "release", "crash")
    assert "kv_cache_dtype not supported" in j.detail


def test_probes_are_selected_by_name_only():
    assert not any(s.name.startswith("x-") for s in select(None))
    assert [s.name for s in select("x")] == [s.name for s in PROBES]


def test_an_engines_environment_reaches_its_process_and_its_identity(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_TURBOQUANT_ATTENTION_KERNEL", raising=False)
    plain = SCENARIOS[0].test
    mq = dataclasses.replace(plain, env=(("VLLM_TURBOQUANT_ATTENTION_KERNEL", "multi_query"),))
    probe = [sys.executable, "-c", "import os; print(os.environ.get('VLLM_TURBOQUANT_ATTENTION_KERNEL'))"]
    seen = {name: subprocess.run(probe, env=_env(tmp_path, [], tmp_path, e.env), capture_output=True, text=True,
                                 check=True).stdout.strip() for name, e in (("plain", plain), ("mq", mq))}
    assert seen == {"plain": "None", "mq": "multi_query"}
    assert engine_digest(mq) != engine_digest(plain)
    assert '"env"' not in plain.key()  # engines without an environment keep their digests


def test_the_recorded_command_names_neither_the_harness_path_nor_the_report_folder():
    from harness.__main__ import portable_command

    argv = ["/some/checkout/gpu/harness/__main__.py", "run", "--tree", "patched=/x/p", "--out", "/r",
            "--scenarios", "a", "--out=/r2", "--title", "two words"]
    assert portable_command(argv) == "python -m harness run --tree patched=/x/p --scenarios a --title 'two words'"


def test_forced_decodes_run_on_the_v1_model_runner(tmp_path, monkeypatch):
    """The forcing logits processor has V1's interface; Model Runner V2 (vLLM >= 0.29's default) refuses it."""
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    s = BY_NAME["f-hybrid-tq-k8v4-mtp3-bfloat16"]
    forced = child_env(s.reference, tmp_path, [], tmp_path, forced=True)
    free = child_env(s.test, tmp_path, [], tmp_path, forced=False)
    assert forced["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in free


def test_two_builds_of_one_model_at_once_share_one_complete_folder(tmp_path, monkeypatch):
    """Two harness processes on one --work folder once wrote the same `<dest>.tmp`: the first rename
    took it from under the second (safetensors: "No such file or directory"). Both saves here run
    side by side and both renames come after both saves, the order that broke."""
    spec = models.ModelSpec(name="tiny", arch="llama", seed=3, config=dict(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False))
    together = threading.Barrier(2)
    instantiate = models.instantiate

    def instantiate_in_step(spec, dtype=None):
        model = instantiate(spec, dtype)
        save = model.save_pretrained

        def save_in_step(path, *args, **kwargs):
            together.wait(timeout=60)
            try:
                return save(path, *args, **kwargs)
            finally:
                together.wait(timeout=60)

        model.save_pretrained = save_in_step
        return model

    monkeypatch.setattr(models, "instantiate", instantiate_in_step)
    # transformers resolves its model classes lazily, and two threads doing that first at once can
    # see a half-loaded module (harness processes build in processes, not threads): resolve it here.
    import transformers

    assert transformers.LlamaForCausalLM and transformers.LlamaConfig
    with ThreadPoolExecutor(2) as pool:
        dests = [f.result() for f in [pool.submit(models.build, spec, tmp_path) for _ in range(2)]]
    assert dests[0] == dests[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [dests[0].name]
    assert (dests[0] / "config.json").exists() and list(dests[0].glob("*.safetensors"))
    assert models.build(spec, tmp_path) == dests[0]  # the finished folder is found, not built again


class _Engine:
    """vLLM's LLMEngine as `staggered` uses it: requests join the running batch at add_request, every step
    gives each running request one more token, a request finishes at its max_tokens."""

    def __init__(self):
        self.running, self.steps, self.joined = {}, 0, []

    def add_request(self, request_id, prompt, params):
        internal = f"{request_id}-x1"
        self.running[internal] = (request_id, [])
        self.joined.append((request_id, self.steps, len(self.running)))
        return internal

    def has_unfinished_requests(self):
        return bool(self.running)

    def step(self):
        self.steps += 1
        outs = []
        for rid, (given, tokens) in list(self.running.items()):
            tokens.append(int(given.split("-")[1]) * 100 + len(tokens))
            finished = len(tokens) == 5
            outs.append(dataclasses.make_dataclass("Out", ["request_id", "finished", "outputs"])(
                given, finished, [dataclasses.make_dataclass("C", ["token_ids"])(list(tokens))]))
            if finished:
                del self.running[rid]
        return outs


def test_staggered_requests_join_at_their_steps_and_come_back_in_prompt_order():
    from harness.child import staggered

    llm = type("LLM", (), {"llm_engine": _Engine()})()
    tokens = staggered(llm, [[1], [2], [3]], None, [3, 0, 3])
    assert [(rid, step) for rid, step, _ in llm.llm_engine.joined] == [("arrival-1", 0), ("arrival-0", 3),
                                                                        ("arrival-2", 3)]
    assert llm.llm_engine.joined[1][2] == 2  # request 0 joined while request 1 was still decoding
    assert [list(c.token_ids) for c in tokens] == [[k * 100 + i for i in range(5)] for k in range(3)]


def test_arrival_and_long_prompt_scenarios():
    arrivals = BY_NAME["i-hybrid-tq-4bit_nc-mtp3-arrivals"]
    (w,) = arrivals.test.workloads
    assert len(w.arrivals) == len(w.prompts) and w.arrivals[0] == 0 and list(w.arrivals) == sorted(w.arrivals)
    assert engine_digest(arrivals.test) != engine_digest(dataclasses.replace(
        arrivals.test, workloads=(dataclasses.replace(w, arrivals=()),)))
    long = BY_NAME["h-hybrid-tq-4bit_nc-mtp1-long"]
    config = long.test.model.config
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (24, 4, 256)
    assert max(map(len, long.test.workloads[0].prompts)) + 96 <= long.test.kwargs["max_model_len"] \
        <= config["max_position_embeddings"]
    assert long.test.kwargs["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}


def test_memory_figures_tell_what_the_profile_counted():
    """The workspace's growth before vLLM logs the KV cache it sized is inside the memory profile; growth after
    comes out of the headroom, and the report names who grew it."""
    from harness.runner import memory_figures

    log = "\n".join([
        "[WORKSPACE DEBUG] Resized workspace from 'turboquant_attn.py:141:_reserve': 0.00 MB -> 50.10 MB (ubatch 0)",
        "INFO gpu_worker.py:760] Available KV cache memory: 5.35 GiB",
        "INFO kv_cache_utils.py:1] GPU KV cache size: 123,744 tokens",
        "[WORKSPACE DEBUG] Resized workspace from 'turboquant_attn.py:450:_reserve_workspace': 50.10 MB -> 524.10 MB",
    ])
    figures = memory_figures(log)
    assert figures == {"kv_cache_tokens": 123744, "kv_cache_gib": 5.35, "workspace_mb_profiled": 50.1,
                       "workspace_mb": 524.1, "workspace_grown_after": ["turboquant_attn.py:450:_reserve_workspace"]}
    judged = report.judge_memory("m", "patched", {"booted": True, **figures})
    assert judged.verdict == "figure" and "50.1 MB of it before the KV cache was sized" in judged.detail
    assert "grown after by turboquant_attn.py:450" in judged.detail
    assert memory_figures("no memory lines") == {}


def test_config_only_models_name_their_causal_lm(tmp_path):
    """vLLM takes a bare config's transformers base model, which it serves as a pooling model for qwen3_next:
    the harness writes the causal-LM class (and the MTP layer count) into config.json."""
    directory = models.build(models.QWEN27B_SHAPED_MTP, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"] and config["num_nextn_predict_layers"] == 1
    assert not list(directory.glob("*.safetensors"))


def test_drafts_recorder_keeps_the_outermost_proposals_while_recording():
    """harness.drafts: a speculator subclass calling its parent's propose is one proposal; nothing is kept
    outside ``recording``; two logs are compared proposal by proposal."""
    torch = pytest.importorskip("torch")
    from harness import drafts

    class Base:
        def propose(self, n):
            return torch.tensor([[n, n + 1], [n + 2, n + 3]])

    class Sub(Base):
        def propose(self, n):
            return super().propose(n)

    for cls in (Base, Sub):
        cls.propose = drafts._wrap(cls.__dict__["propose"])
    Sub().propose(1)
    with drafts.recording() as log:
        Sub().propose(3)
        Base().propose(5)
    Sub().propose(7)
    assert log == [[[3, 4], [5, 6]], [[5, 6], [7, 8]]]
    assert drafts.first_difference(log, [list(p) for p in log]) is None
    assert drafts.first_difference(log, [log[0], [[5, 6], [7, 9]]]).startswith("proposal 1 of 2")
    assert drafts.first_difference(log, log[:1]) == "2 proposals against 1"


def test_jit_monitor_lines_name_the_kernels_compiled_while_serving():
    """vLLM's JIT monitor logs a kernel compiled after the warm-up once per kernel; the figures list them."""
    from harness.runner import memory_figures

    log = ("INFO 11-27 [gpu_worker.py] Graph capturing finished\n"
           "WARNING 11-27 [jit_monitor.py:126] Triton kernel JIT compilation during inference: _tq_mq_verify_fwd. "
           "This causes a latency spike; consider extending warmup to cover this shape/config.\n"
           "WARNING 11-27 [jit_monitor.py:126] Triton kernel JIT compilation during inference: "
           "_fused_recurrent_gated_delta_rule_fwd_kernel (constexprs=...). This causes a latency spike\n"
           "WARNING 11-27 [jit_monitor.py:126] Triton kernel JIT compilation during inference: _tq_mq_verify_fwd. "
           "This causes a latency spike\n")
    assert memory_figures(log)["jit_compiled_serving"] == [
        "Triton:_fused_recurrent_gated_delta_rule_fwd_kernel", "Triton:_tq_mq_verify_fwd"]
    assert "jit_compiled_serving" not in memory_figures("INFO nothing compiled\n")


def test_tensor_parallel_scenarios_split_every_engine_and_run_only_when_named():
    from harness.scenarios import TP2

    assert TP2 and all(s.name.endswith("-tp2") and s.name in BY_NAME for s in TP2)
    for s in TP2:
        assert all(e.kwargs["tensor_parallel_size"] == 2 for e in s.engines())
        base = BY_NAME.get(s.name.removesuffix("-tp2"))
        if base is not None:  # the same scenario on one GPU: only the split differs
            assert dataclasses.replace(s.test, kwargs={k: v for k, v in s.test.kwargs.items()
                                                       if k != "tensor_parallel_size"}) == base.test
    users = [s for s in TP2 if s.name.startswith("f-hybrid-g6d256-")]
    assert users and all(s.test.model is models.QWEN3_NEXT12_G6D256_MTP for s in users)
    defaults = {s.name for s in select(None)}
    assert not {s.name for s in TP2} & defaults
    assert [s.name for s in select("tp2")] == [s.name for s in TP2]


@pytest.mark.integration
def test_a_strict_engine_fails_and_names_a_kernel_compiled_after_its_first_request(monkeypatch):
    """Engine.jit_strict: after the first request, vLLM's own JIT monitor (0.33.0's file, activated as the worker
    activates it after warm-up) raises on a Triton compile, and the child's record names the kernel."""
    import types

    from triton import knobs

    from harness.child import strict_jit_after_warmup
    from vllm_patch.infrastructure.downloads import pinned_base_tree
    from vllm_patch.lines import CURRENT, line_named
    from vllm_tree import load_module
    from vllm_trees import PROJECT

    tree = pinned_base_tree(line_named(PROJECT, CURRENT).load().pin, quiet=True)
    monitor = load_module(tree, "vllm/utils/jit_monitor.py")
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    vllm_utils = types.ModuleType("vllm.utils")
    vllm_utils.jit_monitor = monitor
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.utils", vllm_utils)
    monkeypatch.setitem(sys.modules, "vllm.utils.jit_monitor", monitor)
    assert strict_jit_after_warmup() == "the JIT monitor is not active in this process"
    monkeypatch.setattr(monitor, "_active", False)
    monitor.activate(mode="warn", verbose=True)  # verbose: every compile logged (the shimmed logger has no _once)
    knobs.runtime.jit_post_compile_hook(fn=types.SimpleNamespace(name="_before"))  # warm-up: logged, not raised
    compiled = strict_jit_after_warmup()
    assert compiled == []
    with pytest.raises(RuntimeError, match="_tq_mq_verify_fwd"):
        knobs.runtime.jit_post_compile_hook(fn=types.SimpleNamespace(name="_tq_mq_verify_fwd"))
    assert compiled == ["_tq_mq_verify_fwd"]


def test_strict_jit_scenarios_warm_up_once_and_judge_the_engine_under_the_consumer_cap():
    from harness.scenarios import JIT

    assert JIT and all(s.name in BY_NAME and s.name not in {x.name for x in SCENARIOS} for s in JIT)
    assert select("j") == list(JIT)
    for s in JIT:
        assert s.test.jit_strict and not s.reference.jit_strict
        assert dict(s.test.env)["VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY"] == "101376"
        assert s.test.model in (models.QWEN3_NEXT12_G6D256_MTP, models.LLAMA6_G6D256)
        assert (s.test.model.config["num_attention_heads"], s.test.model.config["num_key_value_heads"],
                s.test.model.config["head_dim"]) == (24, 4, 256)
        arrivals = s.test.workloads[0].arrivals
        assert len(set(arrivals)) > 8 and len(arrivals) == 16
    # A model without MoE layers (whose kernel compiles at new token counts in the release too) among them.
    assert any("num_experts" not in s.test.model.config for s in JIT)
    assert '"jit_strict": true' in JIT[0].test.key()
    assert "jit_strict" not in JIT[0].reference.key()


def test_memory_trace_reports_each_workload_against_the_profile_and_the_one_that_failed():
    oom = {"type": "OutOfMemoryError", "message": "CUDA out of memory", "at": "turboquant_attn.py:1"}
    test = {"booted": True, "kv_cache_tokens": 900000, "error": oom,
            "profile": {"requested_gib": 23.28, "kv_cache_gib": 4.1, "torch_estimate_gib": 22.5},
            "workloads": {"single8k": {"seconds": 3.2, "peak_allocated_gib": 21.9, "peak_reserved_gib": 22.05},
                          "single32k": {"seconds": 9.0, "peak_allocated_gib": 22.6, "peak_reserved_gib": 23.0},
                          "single64k": {"seconds": 1.0, "error": oom, "peak_allocated_gib": 23.9,
                                        "peak_reserved_gib": 23.99}}}
    j = report.judge_memory("l24", "without-0008", test)
    assert j.verdict == "crash" and "while generating" in j.detail
    assert "budget 23.28 GiB" in j.detail and "torch estimate 22.50 GiB" in j.detail
    assert "single8k: peak 22.05 GiB reserved (21.90 allocated, -2.0% of the estimate)" in j.detail
    assert "single32k: peak 23.00 GiB reserved" in j.detail and "+2.2% of the estimate" in j.detail
    assert "single64k: FAILED (OutOfMemoryError)" in j.detail
    fine = {**test, "error": None, "workloads": dict(list(test["workloads"].items())[:2])}
    assert report.judge_memory("l24", "patched", fine).verdict == "figure"


def test_long_context_memory_scenarios_are_the_users_and_run_only_by_name():
    from harness import scenarios as sc

    chosen = sc.select("l24")
    assert [s.name for s in chosen] == ["l24-4bit_nc-s8", "l24-4bit_nc-s64", "l24-3bit_nc-s8", "l24-3bit_nc-s64"]
    assert not {s.name for s in chosen} & {s.name for s in sc.select(None)}
    for s in chosen:
        e = s.test
        assert e.memory_trace and s.oracle == "memory" and s.reference is e
        env = dict(e.env)
        assert env["VP_EMULATE_GPU_GIB"] == "24" and env["VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY"] == "101376"
        assert e.kwargs["gpu_memory_utilization"] == 0.97 and e.kwargs["speculative_config"] == sc.mtp(3)
        assert e.kwargs["max_model_len"] == e.model.config["max_position_embeddings"] == 262144
        assert (e.model.config["num_attention_heads"], e.model.config["num_key_value_heads"],
                e.model.config["head_dim"]) == (24, 4, 256)
        lengths = [len(p) for w in e.workloads for p in w.prompts]
        assert max(lengths) < e.kwargs["max_model_len"]
        assert '"memory_trace": true' in e.key()
    singles = sc.BY_NAME["l24-3bit_nc-s8"].test.workloads
    assert [len(w.prompts[0]) for w in singles] == sorted(sc.LONG_PROMPTS)
    burst = sc.BY_NAME["l24-3bit_nc-s64"].test
    assert burst.kwargs["max_num_seqs"] == 64 and len(burst.workloads[0].prompts) == 64
    assert len(set(burst.workloads[0].prompts)) == 64


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state


def test_reap_ends_the_workers_an_engine_process_left_behind():
    """An engine's process that ends with os._exit leaves its worker processes running (they held GPU
    memory); reap() on its session ends them."""
    import time

    from harness.runner import reap

    engine = ("import os, subprocess, sys\n"
              "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              "print(w.pid, flush=True)\n"
              "os._exit(0)\n")
    proc = subprocess.Popen([sys.executable, "-c", engine], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    worker = int(proc.stdout.readline())
    proc.wait()
    assert _alive(worker)  # what happened to the H100s' memory
    reap(proc.pid)
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)
    reap(proc.pid)  # again, with nothing left to kill: no error


def test_a_std_override_draws_only_the_matrices_it_names_at_its_scale():
    spec = models.ModelSpec(name="tiny-o", arch="llama", seed=3, std=0.02,
                            std_overrides=(("self_attn.o_proj.weight", 0.002),),
                            config=dict(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                        max_position_embeddings=64, tie_word_embeddings=False))
    params = dict(models.instantiate(spec).named_parameters())
    o = params["model.layers.0.self_attn.o_proj.weight"].std().item()
    q = params["model.layers.0.self_attn.q_proj.weight"].std().item()
    assert 0.0015 < o < 0.0025 and 0.015 < q < 0.025


def test_models_without_overrides_keep_their_digests():
    """The field is left out of the key where unused, so the models built before it are found again."""
    assert "std_overrides" not in models.QWEN3_NEXT12_DENSE_MTP.key()
    assert json.loads(models.LLAMA6.key()) == {"name": "llama6", "arch": "llama", "config": models.LLAMA6.config,
                                               "seed": 1, "std": 0.03, "embed_std": 1.0, "mtp_layers": 0,
                                               "weights": True}


def test_the_users_geometry_model_writes_attention_at_the_dense_hybrid_s_gain():
    """Its output projection reads 24 x 256 features where the dense hybrid's reads 4 x 128: the std is scaled by
    the square root of the ratio (python -m harness.sensitivity measures what that does to the oracle's noise)."""
    dense, users = models.QWEN3_NEXT12_DENSE_MTP, models.QWEN3_NEXT12_G6D256_MTP

    def gain(s: models.ModelSpec) -> float:
        fan_in = s.config["num_attention_heads"] * s.config["head_dim"]
        return fan_in * s.std_of("model.layers.1.self_attn.o_proj.weight") ** 2

    assert gain(users) == pytest.approx(gain(dense), rel=5e-3)
    assert users.std_of("model.layers.1.self_attn.q_proj.weight") == dense.std


def test_a_report_names_the_stack_its_engines_ran_on_as_their_ready_messages_do():
    import argparse

    import torch
    import triton

    from harness.__main__ import _meta
    from harness.serve import platform

    meta = _meta(argparse.Namespace(cmd="run", title="t", bundle_note=None), None)
    assert (meta["torch"], meta["triton"]) == (torch.__version__, triton.__version__)
    assert meta.get("device", "cpu") == platform()["device"]
    # A report rewritten from results brought back from a GPU host names no stack of its own host's.
    rewritten = _meta(argparse.Namespace(cmd="report", title="t", bundle_note="two H200s, torch 2.14"), None)
    assert not {"torch", "triton", "device"} & set(rewritten) and rewritten["bundle"] == "two H200s, torch 2.14"
