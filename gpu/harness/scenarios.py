"""The GPU scenarios: an engine configuration under test, a reference configuration, a
tiny random model and the prompts (token ids; no tokenizer). Pure data.

Each scenario names the patches that fix it and what unpatched v0.20.0 does, so a
report can say whether a run shows the bug or the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from .models import (
    LLAMA6,
    LLAMA6_G6D256,
    LLAMA8B,
    LLAMA28,
    QWEN3_NEXT12,
    QWEN3_NEXT12_DENSE_MTP,
    QWEN3_NEXT12_G6D256_MTP,
    QWEN3_NEXT12_MTP,
    QWEN27B_SHAPED_256K_MTP,
    QWEN27B_SHAPED_MTP,
    ModelSpec,
)


@dataclass(frozen=True)
class Workload:
    """One `LLM.generate` call: the prompts go in as one batch; or, with `arrivals`, one request
    a prompt through the engine's request API, prompt i added before engine step `arrivals[i]`, so
    that later prompts arrive while earlier requests decode (harness.child.staggered)."""

    name: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int = 64
    arrivals: tuple[int, ...] = ()


@dataclass(frozen=True)
class Engine:
    """An engine to start in a subprocess: a model and `LLM(...)` keyword arguments."""

    model: ModelSpec
    kwargs: dict[str, Any]
    workloads: tuple[Workload, ...]
    # Also score every output token against the engine's own greedy choice by a prefill of
    # prompt + output (see harness.child.teacher_gaps).
    score: bool = False
    # Decode forced to follow another engine's tokens, scoring each of them (harness.forcing);
    # the runner gives it the tokens once that engine has run.
    force: bool = False
    # Environment variables of the engine's process (vLLM reads some settings only there, such as
    # VLLM_TURBOQUANT_ATTENTION_KERNEL), as (name, value) pairs.
    env: tuple[tuple[str, str], ...] = ()
    # Also record the logprob of every emitted token (the `twin` oracle compares them bit for bit).
    logprobs: bool = False
    # Warm up on the first request alone, then fail on any kernel compiled after it (vLLM's JIT monitor in its
    # error mode; harness.child.strict_jit_after_warmup). One GPU: the monitor of a worker in the child's process.
    jit_strict: bool = False
    # No warm-up; each workload's peak of torch's allocator recorded (harness.child.memory_trace), the workloads
    # in order until one fails (after an out-of-memory error the engine is not trusted further).
    memory_trace: bool = False

    def key(self) -> str:
        """Engines with the same key give the same tokens; a shared reference runs once."""
        return json.dumps({"model": self.model.key(), "kwargs": self.kwargs, "score": self.score,
                           "force": self.force, **({"env": list(map(list, self.env))} if self.env else {}),
                           **({"logprobs": True} if self.logprobs else {}),
                           **({"jit_strict": True} if self.jit_strict else {}),
                           **({"memory_trace": True} if self.memory_trace else {}),
                           "workloads": [[w.name, w.prompts, w.max_tokens, *([w.arrivals] if w.arrivals else [])]
                                         for w in self.workloads]},
                          sort_keys=True)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    test: Engine
    reference: Engine
    unpatched: str
    fixed_by: tuple[str, ...] = field(default_factory=tuple)
    # "tokens": the test's greedy tokens must equal the reference's. "teacher": every token the
    # test emits must be the greedy choice of a prefill over the same prefix (both engines are
    # scored; see report.judge), which tells a wrong state apart from a near-tie flipped by
    # rounding, after which exact comparison says nothing. "forced": the reference (force=True,
    # no speculation, the same quantized KV cache) decodes the test's tokens one a step and
    # scores each; its noise is measured by forcing it onto the tokens of `calibration`, the
    # same plain engine run freely with other batching (see report.judge_forced). "twin": the
    # reference is the test engine itself in PIECEWISE mode (attention outside the graphs, the same
    # schedule and padding), and tokens and logprobs must be bit-identical: exact for the CUDA-graph
    # bug class, where the forced oracle's tolerance cannot tell the verify kernel's legitimate
    # rounding from a small error (see twin()).
    oracle: str = "tokens"
    calibration: Engine | None = None
    # Oracle "twin": the (test, reference) pair of the same twin without the backend under test, where FULL
    # graphs change a decode by themselves (see report._judge_twin).
    control: tuple[Engine, Engine] | None = None

    def engines(self) -> tuple[Engine, ...]:
        """Every free-running engine the scenario needs (forced decodes apart)."""
        return tuple(e for e in (self.test, self.reference, self.calibration, *(self.control or ())) if e is not None)


def _prompt(seed: int, length: int, vocab: int, period: int | None = None) -> tuple[int, ...]:
    """A deterministic prompt; with a period it repeats, so an ngram drafter finds matches."""
    span = period or length
    base = [(seed * 131 + i * (2 * seed + 7) + (i * i) % 13) % vocab for i in range(span)]
    return tuple(base[i % span] for i in range(length))


def prompts(vocab: int) -> tuple[tuple[int, ...], ...]:
    """Four heterogeneous prompts: repeating and not, 14 to 96 tokens."""
    return (
        _prompt(1, 24, vocab, period=6),
        _prompt(2, 40, vocab),
        _prompt(3, 14, vocab, period=4),
        _prompt(4, 96, vocab, period=24),
    )


COMMON: dict[str, Any] = {
    "max_model_len": 1024,
    # A fixed KV cache instead of memory profiling, so engines can share the GPU at once.
    "gpu_memory_utilization": 0.2,
    "kv_cache_memory_bytes": 2 << 30,
    "max_num_seqs": 8,
    "seed": 0,
    "skip_tokenizer_init": True,
    "disable_log_stats": False,
    # TurboQuant needs FlashAttention 2; the offline bundle carries only FA2.
    "attention_config": {"flash_attn_version": 2},
}


def ngram(k: int) -> dict[str, Any]:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


# The reference for a CUDA-graph scenario: the same compiled model, run without graphs. (With
# enforce_eager the model is not compiled either, and bf16 rounding differences of the
# uncompiled ops flip near-tied greedy tokens, which would hide what graphs change.)
NO_GRAPHS: dict[str, Any] = {"compilation_config": {"cudagraph_mode": "NONE"}}


def _engine(model: ModelSpec, workloads: tuple[Workload, ...], score: bool = False, **kwargs: Any) -> Engine:
    extra: dict[str, Any] = {}
    if model.arch == "qwen3_next":
        # The FlashInfer GDN prefill kernel (vLLM's default on Hopper) is not in the bundle.
        extra["additional_config"] = {"gdn_prefill_backend": "triton"}
    return Engine(model=model, kwargs={**COMMON, **extra, **kwargs}, workloads=workloads, score=score)


def _turboquant_llama(preset: str) -> Scenario:
    batch = (Workload("batch4", prompts(LLAMA6.config["vocab_size"])),)
    kv = {"kv_cache_dtype": f"turboquant_{preset}", "speculative_config": ngram(3)}
    return Scenario(
        name=f"a-tq-{preset}-ngram3-graphs",
        title=f"Llama 6 layers, TurboQuant {preset}, ngram k=3, FULL_AND_PIECEWISE graphs vs no graphs",
        test=_engine(LLAMA6, batch, **kv),
        reference=_engine(LLAMA6, batch, **NO_GRAPHS, **kv),
        unpatched="crashes while capturing CUDA graphs (.tolist() in turboquant_attn.py _prefill_attention)",
        fixed_by=("0001", "0002"),
    )


def _turboquant_llama_workarounds() -> tuple[Scenario, ...]:
    """What users of unpatched v0.20.0 run instead, and TurboQuant's decode graphs alone: both
    must keep working, on either tree."""
    batch = (Workload("batch4", prompts(LLAMA6.config["vocab_size"])),)
    kv = {"kv_cache_dtype": "turboquant_k8v4"}
    spec = {**kv, "speculative_config": ngram(3)}
    piecewise = {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}
    # The forced decode runs without async scheduling: the forcing reads each request's output so far.
    forced_plain = {**kv, **NO_GRAPHS, "async_scheduling": False}
    return (
        Scenario(
            name="a-tq-k8v4-ngram3-piecewise",
            title="Llama 6 layers, TurboQuant k8v4, ngram k=3, PIECEWISE graphs (the workaround) vs no graphs",
            test=_engine(LLAMA6, batch, **piecewise, **spec),
            reference=_engine(LLAMA6, batch, **NO_GRAPHS, **spec),
            unpatched="runs: attention stays out of the graphs",
        ),
        # Judged by the forced oracle: FULL graphs and eager decodes of a TurboQuant cache round
        # differently (0.33.0's release and line both left one prompt at token 22 under exact
        # comparison), so exact tokens cannot tell a flipped near-tie from a wrong decode.
        Scenario(
            name="e-tq-k8v4-decode-graphs",
            title="Llama 6 layers, TurboQuant k8v4 without speculation, FULL_AND_PIECEWISE graphs vs a "
                  "no-graphs decode forced along the same tokens",
            test=_engine(LLAMA6, batch, **kv),
            reference=replace(_engine(LLAMA6, batch, **forced_plain), force=True),
            # Other batching: one request at a time.
            calibration=_engine(LLAMA6, batch, max_num_seqs=1, **forced_plain),
            unpatched="runs: single-token decodes are captured in FULL graphs",
            oracle="forced",
        ),
    )


def _gdn_ngram(k: int, name: str, dtype: str | None = None, model: ModelSpec = QWEN3_NEXT12) -> Scenario:
    """Speculative vs plain decoding on the hybrid model. With dtype="float16" (10 mantissa bits against
    bfloat16's 7) the decode-vs-prefill rounding noise, and with it the teacher oracle's tolerance, is
    about 8 times smaller."""
    vocab = model.config["vocab_size"]
    workloads = (Workload("single", prompts(vocab)[:1], max_tokens=96), Workload("mixed4", prompts(vocab)))
    small_steps: dict[str, Any] = {"max_num_batched_tokens": 64, **({"dtype": dtype} if dtype else {})}
    return Scenario(
        name=name,
        title=f"Qwen3-Next hybrid (GDN + attention), {dtype or 'bfloat16'}, ngram k={k} vs no speculation, "
              "batch of 1 and mixed batch of 4",
        test=_engine(model, workloads, score=True, speculative_config=ngram(k), **small_steps),
        reference=_engine(model, workloads, score=True, **small_steps),
        unpatched="runs, but emits tokens that are not the greedy choice after an accepted draft (GDN state)",
        fixed_by=("0004", "0005", "0006"),
        oracle="teacher",
    )


def mtp(k: int) -> dict[str, Any]:
    return {"method": "mtp", "num_speculative_tokens": k}


def _combined(preset: str, method: str, dtype: str | None = None, k: int = 3,
              model: ModelSpec = QWEN3_NEXT12_DENSE_MTP) -> Scenario:
    """What the seeds' users run, at once: the hybrid, TurboQuant, speculation (ngram or MTP),
    FULL_AND_PIECEWISE graphs (the default), a request alone and a mixed batch of 4 in 64-token
    steps. Judged by the forced oracle: a plain decode over the same quantized cache. The dense hybrid
    (see models.QWEN3_NEXT12_DENSE_MTP): on the MoE one a router near-tie moved one token by 18 nats.
    With QWEN3_NEXT12_G6D256_MTP, the users' attention geometry (24/4 heads of 256), named f-hybrid-g6d256-."""
    vocab = model.config["vocab_size"]
    workloads = (Workload("single", prompts(vocab)[:1], max_tokens=96), Workload("mixed4", prompts(vocab)))
    base: dict[str, Any] = {"kv_cache_dtype": f"turboquant_{preset}", **({"dtype": dtype} if dtype else {})}
    spec = ngram(k) if method == "ngram" else mtp(k)
    # The forced decode runs without async scheduling: the forcing reads each request's output so far.
    plain = {**base, "async_scheduling": False}
    users = model is QWEN3_NEXT12_G6D256_MTP
    return Scenario(
        name=f"f-hybrid-{'g6d256-' if users else ''}tq-{preset}-{method}{k}-{dtype or 'bfloat16'}",
        title=f"Qwen3-Next hybrid{' (24/4 heads, head dim 256)' if users else ''}, TurboQuant {preset}, "
              f"{method} k={k}, FULL_AND_PIECEWISE, {dtype or 'bfloat16'}, batch of 1 and mixed batch of 4, "
              "vs a plain decode forced along the same tokens",
        test=_engine(model, workloads, speculative_config=spec, max_num_batched_tokens=64, **base),
        reference=replace(_engine(model, workloads, max_num_batched_tokens=64, **plain), force=True),
        # Other batching: whole prompts in one step.
        calibration=_engine(model, workloads, max_num_batched_tokens=1024, **plain),
        unpatched="refused: NotImplementedError in vllm/engine/arg_utils.py (hybrid models)",
        fixed_by=("0001", "0002", "0003", "0006"),
        oracle="forced",
    )


def _preemption(method: str) -> Scenario:
    """Speculation on the hybrid with a KV cache of a few blocks for 12 requests: running requests
    are preempted and recompute their prompt and output in 64-token chunks, so rows past their
    prompt are scheduled several tokens at once (patch 0006 must leave them off the spec path).
    Judged by the forced oracle: a prefill over prompt + output (the teacher oracle) differs from
    this model's bf16 decode by more than its median top-1/top-2 margin, so it could not judge."""
    model = QWEN3_NEXT12_DENSE_MTP
    vocab = model.config["vocab_size"]
    many = tuple(_prompt(seed, 40 + 8 * (seed % 5), vocab, period=6 + seed % 4) for seed in range(1, 13))
    workloads = (Workload("preempt12", many, max_tokens=160),)
    small = {"max_num_batched_tokens": 64, "num_gpu_blocks_override": 48, "max_model_len": 512}
    spec = ngram(3) if method == "ngram" else mtp(3)
    plain = {**small, "async_scheduling": False}
    return Scenario(
        name=f"g-hybrid-preempt-{method}3",
        title=f"Qwen3-Next hybrid, {method} k=3, 12 requests in a KV cache of 48 blocks (preemption), "
              "vs a plain decode forced along the same tokens",
        test=_engine(model, workloads, speculative_config=spec, **small),
        reference=replace(_engine(model, workloads, **plain), force=True),
        # Other batching: whole prompts in one step, a KV cache that holds every request.
        calibration=_engine(model, workloads, max_num_batched_tokens=1024, max_model_len=512,
                            async_scheduling=False),
        unpatched="runs, but emits tokens that are not the greedy choice (GDN state)",
        fixed_by=("0004", "0005", "0006", "0008"),
        oracle="forced",
    )


def _long_prompts(preset: str, k: int) -> Scenario:
    """vllm#52475 (RTX 5090, a Qwen hybrid, TurboQuant MSE presets with MTP): K=3 collapses into one
    repeated token on prompts of ~8k tokens, K=1 ends in an illegal memory access. Prompts of 1.5k to 7k
    tokens (hundreds of KV blocks), FULL_AND_PIECEWISE, a request alone and a mixed batch of 3, in the users'
    attention geometry (24/4 heads, head dim 256). Judged by the forced oracle.

    Every engine prefills whole prompts in one step: TurboQuant attends to earlier prompt chunks through the
    quantized cache and to the chunk itself exactly, so where two engines cut a prompt at other places their
    tokens differ by quantization alone (measured on 0.33.0 at 7k tokens: up to 17.5 nats with 4bit_nc, 44 with
    3bit_nc, beyond the forced decode's median margin), and the oracle could not judge. The calibration
    decodes the same prompts one request at a time."""
    model = QWEN3_NEXT12_G6D256_MTP
    vocab = model.config["vocab_size"]
    long = (_prompt(71, 7000, vocab), _prompt(72, 1500, vocab), _prompt(73, 4000, vocab))
    workloads = (Workload("single7k", long[:1], max_tokens=96), Workload("mixed3", long, max_tokens=64))
    base: dict[str, Any] = {"kv_cache_dtype": f"turboquant_{preset}", "max_model_len": 8192,
                            "max_num_batched_tokens": 16384}
    plain = {**base, "async_scheduling": False}
    return Scenario(
        name=f"h-hybrid-tq-{preset}-mtp{k}-long",
        title=f"Qwen3-Next hybrid (24/4 heads, head dim 256), TurboQuant {preset}, MTP k={k}, FULL_AND_PIECEWISE, "
              "prompts of 1.5k-7k tokens, "
              "a request alone and a mixed batch of 3, vs a plain decode forced along the same tokens",
        test=_engine(model, workloads, speculative_config=mtp(k), **base),
        reference=replace(_engine(model, workloads, **plain), force=True),
        calibration=_engine(model, workloads, **{**plain, "max_num_seqs": 1}),
        unpatched="0.33.0 (vllm#52475): K=3 collapses into a repeated token, K=1 an illegal memory access",
        fixed_by=("0001", "0003"),
        oracle="forced",
    )


def _arrivals(preset: str, method: str) -> Scenario:
    """Requests that arrive while others decode: two start together, four more join one by one while
    the first are in verify steps, so whole prompts share batches with verify rows, the batches the line
    splits between the kernel route and the per-request loop. (A fork's users report that a late request
    pollutes the first request's output with TurboQuant + MTP.) Each prompt fits one step's token budget
    beside the verify rows, so no engine cuts a prompt into chunks (see _long_prompts); the reference and
    the calibration (one request at a time) prefill whole prompts too."""
    model = QWEN3_NEXT12_DENSE_MTP
    vocab = model.config["vocab_size"]
    six = tuple(_prompt(80 + i, 90 + 22 * i, vocab, period=(5 + i if method == "ngram" and i % 2 else None))
                for i in range(6))
    workloads = (Workload("arrivals6", six, max_tokens=96, arrivals=(0, 0, 8, 11, 19, 30)),)
    base: dict[str, Any] = {"kv_cache_dtype": f"turboquant_{preset}"}
    spec = ngram(3) if method == "ngram" else mtp(3)
    plain = {**base, "async_scheduling": False, "max_num_batched_tokens": 2048}
    return Scenario(
        name=f"i-hybrid-tq-{preset}-{method}3-arrivals",
        title=f"Qwen3-Next hybrid, TurboQuant {preset}, {method} k=3, FULL_AND_PIECEWISE, 6 requests arriving "
              "at engine steps 0, 0, 8, 11, 19, 30, vs a plain decode forced along the same tokens",
        test=_engine(model, workloads, speculative_config=spec, max_num_batched_tokens=256, **base),
        reference=replace(_engine(model, workloads, **plain), force=True),
        calibration=_engine(model, workloads, **{**plain, "max_num_seqs": 1}),
        unpatched="0.33.0: FULL graphs over the host-driven verify loop (0001's bug) on every verify step",
        fixed_by=("0001", "0003"),
        oracle="forced",
    )


# A consumer GPU's shared memory a block (sm_86/89/120: 99 KiB), as the multi-query kernel's tiles are chosen for it
# (VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY caps the device's own limit).
CONSUMER_SMEM_ENV: tuple[tuple[str, str], ...] = (("VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY", "101376"),)


def _jit_strict(preset: str, method: str, model: ModelSpec = QWEN3_NEXT12_G6D256_MTP) -> Scenario:
    """No kernel compiled while serving: after a first request alone, 16 requests of different lengths arrive
    one or two an engine step (batches of 1 to 16 requests, whole prompts beside verify rows), then 12 at once,
    in the users' attention geometry on 99 KiB of shared memory a block. The engine under test runs with vLLM's
    JIT monitor in its error mode from the end of the first request (Engine.jit_strict): a kernel variant first
    met at some batch size (a split count, a K+1, a cache layout the route did not compile before serving)
    fails the run and is named. Tokens judged by the forced oracle, as the arrivals scenario. On the hybrid its
    MoE layers' kernel compiles at new token counts (the release's too); ``LLAMA6_G6D256`` has none."""
    vocab = model.config["vocab_size"]
    sixteen = tuple(_prompt(120 + i, 40 + 9 * i, vocab, period=(4 + i % 5 if method == "ngram" else None))
                    for i in range(16))
    workloads = (Workload("arrivals16", sixteen, max_tokens=48,
                          arrivals=(0, 0, 1, 2, 3, 5, 7, 9, 12, 15, 18, 22, 26, 30, 35, 40)),
                 Workload("batch12", sixteen[4:], max_tokens=48))
    base: dict[str, Any] = {"kv_cache_dtype": f"turboquant_{preset}"}
    spec = ngram(3) if method == "ngram" else mtp(3)
    plain = {**base, "async_scheduling": False, "max_num_batched_tokens": 2048}
    # jit_monitor_verbose: each compile logged with its constexprs and signature (vLLM 0.25 and newer).
    test = _engine(model, workloads, speculative_config=spec, max_num_batched_tokens=512, jit_monitor_verbose=True,
                   **base)
    hybrid = model.arch == "qwen3_next"
    return Scenario(
        name=f"j-{'hybrid' if hybrid else 'llama'}-g6d256-tq-{preset}-{method}3-jit",
        title=f"{'Qwen3-Next hybrid' if hybrid else 'Llama 6 layers, no MoE'} (24/4 heads, head dim 256), "
              f"TurboQuant {preset}, {method} k=3, "
              "FULL_AND_PIECEWISE, 99 KiB of shared memory a block, batches of 1 to 16 requests after a first "
              "request alone, vLLM's JIT monitor in error mode from then on, vs a plain decode forced along the "
              "same tokens",
        test=replace(test, jit_strict=True, env=CONSUMER_SMEM_ENV),
        reference=replace(_engine(model, workloads, **plain), force=True),
        calibration=_engine(model, workloads, **{**plain, "max_num_seqs": 1}),
        unpatched="0.33.0: FULL graphs over the host-driven verify loop (0001's bug) on every verify step",
        fixed_by=("0001", "0003", "0006"),
        oracle="forced",
    )


def _consumer_smem(s: Scenario) -> Scenario:
    """The engine under test on the shared memory a consumer GPU gives a block (sm_86/89/120: 99 KiB), the limit
    the multi-query kernel's tiles are chosen for (VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY caps the device's)."""
    return replace(s, name=f"{s.name}-99KiB", title=f"{s.title}; the engine under test limited to 99 KiB of shared "
                   "memory a block", test=replace(s.test, env=CONSUMER_SMEM_ENV))


def twin(base: Scenario, **both: Any) -> Scenario:
    """The exact oracle for what FULL graphs change: the engine under test against itself with attention
    run eagerly (PIECEWISE: the same compiled model, the same schedule and token padding), tokens and the
    logprob of every token compared bit for bit. The multi-query kernel's split count comes from shapes only
    (triton_turboquant_verify.tq_mq_verify_num_splits) and reaches its limit at both the graph's padded and
    the eager batch size in these scenarios, so a correct route replays exactly what it computes eagerly;
    a replay that reads stale lengths, slots or a wrong route does not. It says nothing of whether the eager
    route is right: the scenario it twins (forced oracle) and the kernel tests against float64 say that.
    `both`: engine arguments given to test and reference alike."""
    test = replace(base.test, logprobs=True, kwargs={**base.test.kwargs, **both})
    piecewise = {**test.kwargs, "compilation_config": {"cudagraph_mode": "PIECEWISE"}}
    return replace(base, name=f"t-{base.name.split('-', 1)[1]}",
                   title=f"{re.sub(r',? vs [^;]*', '', base.title)}; FULL_AND_PIECEWISE vs the same engine in "
                         "PIECEWISE, tokens and logprobs bit for bit",
                   test=test, reference=replace(test, kwargs=piecewise), calibration=None, oracle="twin")


# The twin of scenario e without TurboQuant: what FULL graphs change in a plain decode whatever the attention backend.
_DECODE_GRAPHS_CONTROL = twin(replace(
    _turboquant_llama_workarounds()[1], name="e-bf16-decode-graphs",
    test=_engine(LLAMA6, (Workload("batch4", prompts(LLAMA6.config["vocab_size"])),)),
    title="Llama 6 layers, bfloat16 KV cache without speculation, FULL_AND_PIECEWISE graphs"))


def _default_memory(k: int | None, graphs: str) -> Scenario:
    """KV cache capacity at vLLM's default memory settings (gpu_memory_utilization, max_num_seqs,
    max_num_batched_tokens left unset) on a 28-layer model with 24 TurboQuant layers: the decode
    scratch competes with the KV cache. Runs alone on the GPU (harness run --jobs 1)."""
    one = (Workload("one", (tuple(range(1, 33)),), max_tokens=16),)
    kw: dict[str, Any] = {"kv_cache_dtype": "turboquant_k8v4", "load_format": "dummy",
                          "compilation_config": {"cudagraph_mode": graphs}}
    if k:
        kw["speculative_config"] = ngram(k)
    engine = Engine(model=LLAMA28, kwargs={"max_model_len": 4096, "seed": 0, "skip_tokenizer_init": True,
                                           "attention_config": {"flash_attn_version": 2}, **kw},
                    workloads=one)
    return Scenario(
        name=f"m-memory-k{k or 0}-{graphs.lower()}",
        title=f"Llama 28 layers (24 TurboQuant k8v4), ngram k={k or 0}, {graphs}, vLLM's default memory "
              "settings: GPU KV cache size",
        test=engine, reference=engine,
        unpatched="runs (PIECEWISE); the decode scratch is per layer, max_num_seqs rows",
        fixed_by=("0002",),
        oracle="memory",
    )


# The budget of a 24 GB card (RTX 3090/4090, A5000) at the users' gpu_memory_utilization, emulated on a larger
# GPU by harness.child: torch's allocations are capped at 24 GiB and vLLM's utilization scaled to 0.97 of it.
CONSUMER_GIB = 24


def _memory_at(model: ModelSpec, spec: dict[str, Any], budget: str) -> Scenario:
    """KV cache capacity and the attention workspace of a users'-shaped model, TurboQuant 4bit_nc and
    speculation with K=3, FULL_AND_PIECEWISE on both trees: at vLLM's default memory settings, or on a 24 GB
    card's budget (gpu_memory_utilization 0.97). The workspace resizes are logged (VLLM_DEBUG_WORKSPACE), so
    the report tells what was reserved before the KV cache was sized (counted by the memory profile) and
    what after (taken from the headroom). Runs alone on the GPU (harness run --jobs 1)."""
    one = (Workload("one", (tuple(range(1, 33)) * 2,), max_tokens=16),)
    kw: dict[str, Any] = {"kv_cache_dtype": "turboquant_4bit_nc", "load_format": "dummy", "seed": 0,
                          "skip_tokenizer_init": True, "attention_config": {"flash_attn_version": 2},
                          "speculative_config": spec}
    env: tuple[tuple[str, str], ...] = (("VLLM_DEBUG_WORKSPACE", "1"),)
    if budget == "24gib":
        kw["gpu_memory_utilization"] = 0.97
        env += (("VP_EMULATE_GPU_GIB", str(CONSUMER_GIB)),)
        if model.arch == "qwen3_next":
            # A hybrid keeps one Mamba state block per running sequence: on 24 GB both trees refuse the default
            # 1,024 sequences at boot (about 312 blocks fit), so users of such cards set max_num_seqs.
            kw["max_num_seqs"] = 256
    if model.arch == "qwen3_next":
        kw["additional_config"] = {"gdn_prefill_backend": "triton"}
    engine = Engine(model=model, kwargs=kw, workloads=one, env=env)
    where = "vLLM's default memory settings" if budget == "defaults" else \
        f"a {CONSUMER_GIB} GB card's budget at gpu_memory_utilization 0.97 (emulated)"
    return Scenario(
        name=f"m33-{model.name}-tq4-{spec['method']}{spec['num_speculative_tokens']}-{budget}",
        title=f"{model.name}, TurboQuant 4bit_nc, {spec['method']} k={spec['num_speculative_tokens']}, "
              f"FULL_AND_PIECEWISE, {where}: GPU KV cache size and attention workspace",
        test=engine, reference=engine,
        unpatched="TurboQuant's decode scratch is reserved by the builders, after the KV cache is sized",
        fixed_by=("0003",),
        oracle="memory",
    )


# The long prompts of the 24 GB memory scenarios, in tokens, shortest first.
LONG_PROMPTS = (8192, 32768, 65536, 131072, 200000)


def _long_context_24gib(preset: str, max_num_seqs: int) -> Scenario:
    """Out of memory or not on a 24 GB card's budget (gpu_memory_utilization 0.97, emulated), the users' way:
    Qwen3.6-27B's widths and heads in 16 layers at its own context (max_model_len 262,144), TurboQuant, MTP K=3,
    FULL_AND_PIECEWISE, 99 KiB of shared memory a block. With max_num_seqs 8, single prompts of 8k to 200k tokens
    one after another (each chunked prefill continues over a cache that grows to the prompt's length); with 64, a
    burst of 64 prompts of 2k arriving at once. No warm-up: each workload's peak of torch's allocator is recorded
    against the budget (Engine.memory_trace), and the first failure ends the run. Runs alone on its GPU."""
    vocab = QWEN27B_SHAPED_256K_MTP.config["vocab_size"]
    if max_num_seqs == 8:
        workloads = tuple(Workload(f"single{n // 1024}k", (_prompt(n, n, vocab),), max_tokens=16)
                          for n in LONG_PROMPTS)
    else:
        workloads = (Workload("burst64x2k", tuple(_prompt(seed, 2048, vocab) for seed in range(1, 65)),
                              max_tokens=16),)
    kw: dict[str, Any] = {"kv_cache_dtype": f"turboquant_{preset}", "load_format": "dummy", "seed": 0,
                          "skip_tokenizer_init": True, "attention_config": {"flash_attn_version": 2},
                          "speculative_config": mtp(3), "max_model_len": 262144, "max_num_seqs": max_num_seqs,
                          "gpu_memory_utilization": 0.97, "additional_config": {"gdn_prefill_backend": "triton"}}
    env = (("VLLM_DEBUG_WORKSPACE", "1"), ("VP_EMULATE_GPU_GIB", str(CONSUMER_GIB)), *CONSUMER_SMEM_ENV)
    engine = Engine(model=QWEN27B_SHAPED_256K_MTP, kwargs=kw, workloads=workloads, env=env, memory_trace=True)
    what = "single prompts of 8k to 200k tokens" if max_num_seqs == 8 else "a burst of 64 prompts of 2k"
    return Scenario(
        name=f"l24-{preset}-s{max_num_seqs}",
        title=f"Qwen3.6-27B widths in 16 layers, TurboQuant {preset}, MTP k=3, max_model_len 262,144, max_num_seqs "
              f"{max_num_seqs}, {CONSUMER_GIB} GB card's budget at 0.97 (emulated), 99 KiB: {what}",
        test=engine, reference=engine,
        unpatched="TurboQuant's scratch beyond the memory profile: the builders' workspace, the continuation "
                  "prefill's dequantized prefix",
        fixed_by=("0008",),
        oracle="memory",
    )


def _ultraquant(s: Scenario, **whole: Any) -> Scenario:
    """A TurboQuant scenario with UltraQuant's 4-bit cache on every engine instead, in bfloat16 (the only dtype
    UltraQuant serves) and with its backend chosen explicitly (0.33 offers it on ROCm only; on CUDA a hybrid
    boots with it, scenario x-single-hybrid-uq; an MTP drafter's layer finds no backend on either tree). The
    release crashes there: its FULL graphs replay the host-driven verify loop (0001's bug).

    Judged by the forced oracle, every engine prefilling whole prompts (``whole``: the engine arguments that
    make them, given to all three), the calibration one request at a time: where two engines cut a prompt at
    other places, UltraQuant's 4-bit cache alone moved the tokens by up to 8 nats on this hybrid, beyond the
    forced decode's median margin (measured on 0.33.0 with 64-token steps against whole prompts), and the
    oracle could not judge (see _long_prompts)."""
    def uq(e: Engine | None, **extra: Any) -> Engine | None:
        if e is None:
            return None
        return replace(e, kwargs={**e.kwargs, "kv_cache_dtype": "ultraquant_4bit", "dtype": "bfloat16",
                                  "attention_config": {**COMMON["attention_config"], "backend": "ULTRAQUANT"},
                                  **whole, **extra})
    preset = s.test.kwargs["kv_cache_dtype"].removeprefix("turboquant_")
    return replace(s, name=s.name.replace(f"tq-{preset}", "uq"),
                   title=s.title.replace(f"TurboQuant {preset}", "UltraQuant 4-bit"),
                   test=uq(s.test), reference=uq(s.reference),
                   calibration=uq(s.calibration, max_num_seqs=1) if s.calibration else None,
                   unpatched="0.33.0: an illegal memory access in FULL graphs over the host-driven verify loop",
                   fixed_by=("0001", "0007"))


def _route_off(s: Scenario) -> Scenario:
    """A control: the scenario's engine under test with the multi-query route off
    (VLLM_TURBOQUANT_ATTENTION_KERNEL=decode), so verify batches take patch 0001's per-request loop, eagerly
    (PIECEWISE), over the device lengths. How far a verify path other than the route lands from the plain
    decode on the same workload, judged the same way."""
    return replace(s, name=f"x-{s.name.split('-', 1)[1]}-loop", title=f"{s.title}; the route off: the per-request "
                   "loop (probe)", test=replace(s.test, env=(("VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode"),)),
                   unpatched="", fixed_by=())


SCENARIOS: tuple[Scenario, ...] = (
    _turboquant_llama("k8v4"),
    _turboquant_llama("4bit_nc"),
    *_turboquant_llama_workarounds(),
    Scenario(
        name="b-tq-hybrid-gdn",
        title="Qwen3-Next hybrid (GDN + attention), TurboQuant k8v4, graphs vs no graphs",
        test=_engine(QWEN3_NEXT12, (Workload("batch4", prompts(QWEN3_NEXT12.config["vocab_size"])),),
                     kv_cache_dtype="turboquant_k8v4"),
        reference=_engine(QWEN3_NEXT12, (Workload("batch4", prompts(QWEN3_NEXT12.config["vocab_size"])),),
                          kv_cache_dtype="turboquant_k8v4", **NO_GRAPHS),
        unpatched="refused: NotImplementedError in vllm/engine/arg_utils.py (hybrid models)",
        fixed_by=("0003",),
    ),
    _gdn_ngram(3, "c-gdn-ngram3"),
    _gdn_ngram(8, "d-gdn-ngram8"),
    _gdn_ngram(3, "c-gdn-ngram3-fp16", dtype="float16"),
    _gdn_ngram(8, "d-gdn-ngram8-fp16", dtype="float16"),
    _combined("k8v4", "ngram"),
    _combined("k8v4", "mtp"),
    _combined("k8v4", "ngram", dtype="float16"),
    _combined("k8v4", "mtp", dtype="float16"),
    _combined("4bit_nc", "ngram"),
    _combined("4bit_nc", "mtp"),
    _preemption("ngram"),
    _preemption("mtp"),
    _long_prompts("4bit_nc", 1),
    _long_prompts("3bit_nc", 3),
    _consumer_smem(_long_prompts("3bit_nc", 3)),
    # The users' configuration at once and preemption, on the tiles of a consumer GPU.
    _consumer_smem(_combined("k8v4", "mtp")),
    _consumer_smem(_combined("4bit_nc", "mtp")),
    _consumer_smem(_preemption("mtp")),
    _arrivals("4bit_nc", "mtp"),
    # The users' configuration with UltraQuant's cache (ngram: an MTP drafter finds no UltraQuant backend on
    # CUDA), requests arriving among verify batches, and what FULL graphs change on its route.
    _ultraquant(_combined("k8v4", "ngram"), max_num_batched_tokens=1024),
    _ultraquant(_arrivals("k8v4", "ngram")),
    twin(_ultraquant(_arrivals("k8v4", "ngram"))),
    # The exact oracle for the graph bug class, on the cases whose forced tolerance is tighter than the
    # verify kernel's own rounding.
    *(twin(s) for s in (_long_prompts("4bit_nc", 1), _long_prompts("3bit_nc", 3), _arrivals("4bit_nc", "mtp"),
                        _combined("4bit_nc", "mtp"))),
    # Plain decode graphs differ from PIECEWISE on Llama whatever the KV cache (vLLM's graphs, not TurboQuant's
    # route): judged against the same twin with a bfloat16 cache.
    replace(twin(_turboquant_llama_workarounds()[1]),
            control=(_DECODE_GRAPHS_CONTROL.test, _DECODE_GRAPHS_CONTROL.reference)),
    # At the consumer tiles a launch has two M tiles, so its split count (4 programs an SM, at most the cap) is
    # below the cap and differs between the graph's padded batch and the eager one: both right, rounded apart.
    # A cap of 16 is reached by both, so the twins compute the same sums.
    twin(_consumer_smem(_long_prompts("3bit_nc", 3)),
         attention_config={"flash_attn_version": 2, "tq_max_kv_splits_for_cuda_graph": 16}),
    _DECODE_GRAPHS_CONTROL,
    *(_default_memory(k, graphs) for k in (3, 8) for graphs in ("FULL_AND_PIECEWISE", "PIECEWISE")),
    *(_memory_at(model, spec, budget) for model, spec in ((LLAMA8B, ngram(3)), (QWEN27B_SHAPED_MTP, mtp(3)))
      for budget in ("defaults", "24gib")),
)


def _probe(base: Scenario, suffix: str, title: str, **test_kwargs: Any) -> Scenario:
    """A variant of a scenario's test engine, judged the same way: to locate a fault, not to prove a fix."""
    test = replace(base.test, kwargs={**base.test.kwargs, **test_kwargs})
    return replace(base, name=f"x-{base.name.split('-', 1)[1]}-{suffix}", title=f"{base.title} ({title})",
                   test=test)


def _without_turboquant(s: Scenario) -> Scenario:
    """A scenario's every engine with vLLM's default KV cache (the model's dtype) instead of TurboQuant."""
    def plain(e: Engine | None) -> Engine | None:
        if e is None:
            return None
        return replace(e, kwargs={k: v for k, v in e.kwargs.items() if k != "kv_cache_dtype"})
    preset = s.test.kwargs["kv_cache_dtype"].removeprefix("turboquant_")
    return replace(s, name=s.name.replace(f"tq-{preset}", "bf16kv"), title=f"{s.title}; bfloat16 KV cache",
                   test=plain(s.test), reference=plain(s.reference), calibration=plain(s.calibration),
                   unpatched="", fixed_by=())


def _single_probe(name: str, title: str, model: ModelSpec, **kv: Any) -> Scenario:
    """One request, 96 tokens, ngram k=3 vs a plain decode forced along its tokens; no calibration
    (the per-position gaps are what a probe is for)."""
    workloads = (Workload("single", prompts(model.config["vocab_size"])[:1], max_tokens=96),)
    return Scenario(
        name=f"x-single-{name}", title=f"{title}, ngram k=3, one request, 96 tokens (probe)",
        test=_engine(model, workloads, speculative_config=ngram(3), **kv),
        reference=replace(_engine(model, workloads, async_scheduling=False, **kv), force=True),
        unpatched="", oracle="forced")


# ngram requests arriving while others verify, every other one without matches (ragged verify batches).
_NGRAM_ARRIVALS = replace(_arrivals("k8v4", "ngram"), name="x-hybrid-tq-k8v4-ngram3-arrivals")

# Probes: selected by name only (`--scenarios x-...`), never by default.
PROBES: tuple[Scenario, ...] = (
    _probe(_combined("k8v4", "ngram"), "nographs", "no CUDA graphs", compilation_config={"cudagraph_mode": "NONE"}),
    _probe(_combined("k8v4", "ngram"), "piecewise", "PIECEWISE graphs",
           compilation_config={"cudagraph_mode": "PIECEWISE"}),
    _probe(_combined("k8v4", "ngram"), "wholeprompts", "whole prompts in one step", max_num_batched_tokens=1024),
    _probe(_preemption("mtp"), "noblocks", "a KV cache that holds every request: no preemption",
           num_gpu_blocks_override=None),
    _probe(_preemption("mtp"), "nographs", "no CUDA graphs", compilation_config={"cudagraph_mode": "NONE"}),
    # Every expert on every token: no router whose near-ties rounding can flip (c-gdn-ngram3-fp16 on 0.33).
    replace(_gdn_ngram(3, "x-gdn-ngram3-fp16-dense", dtype="float16", model=QWEN3_NEXT12_DENSE_MTP),
            title="Qwen3-Next hybrid with every expert routed, float16, ngram k=3 vs no speculation (probe)",
            unpatched="", fixed_by=()),
    _single_probe("hybrid-tq", "Qwen3-Next hybrid, TurboQuant k8v4", QWEN3_NEXT12_MTP,
                  kv_cache_dtype="turboquant_k8v4"),
    _single_probe("hybrid-notq", "Qwen3-Next hybrid, bfloat16 KV cache", QWEN3_NEXT12_MTP),
    _single_probe("hybrid-tq-allskip", "Qwen3-Next hybrid, TurboQuant k8v4 with every attention layer skipped",
                  QWEN3_NEXT12_MTP, kv_cache_dtype="turboquant_k8v4",
                  kv_cache_dtype_skip_layers=["1", "3", "5", "7", "9", "11"]),
    _single_probe("hybrid-tq4nc", "Qwen3-Next hybrid, TurboQuant 4bit_nc", QWEN3_NEXT12_MTP,
                  kv_cache_dtype="turboquant_4bit_nc"),
    _single_probe("llama-tq", "Llama 6 layers, TurboQuant k8v4", LLAMA6, kv_cache_dtype="turboquant_k8v4"),
    _single_probe("dense-hybrid-tq", "dense Qwen3-Next hybrid, TurboQuant k8v4", QWEN3_NEXT12_DENSE_MTP,
                  kv_cache_dtype="turboquant_k8v4"),
    # The forced oracle's reading of the release's own correct route: speculation in PIECEWISE, where the release
    # keeps verify batches out of graphs. How far a right verify path lands from the plain decode.
    _probe(_long_prompts("3bit_nc", 3), "piecewise", "PIECEWISE graphs",
           compilation_config={"cudagraph_mode": "PIECEWISE"}),
    _probe(_arrivals("4bit_nc", "mtp"), "piecewise", "PIECEWISE graphs",
           compilation_config={"cudagraph_mode": "PIECEWISE"}),
    # The same two without TurboQuant (a bfloat16 KV cache): how far the hybrid's own verify path lands from its
    # plain decode in mixed batches, TurboQuant aside.
    _without_turboquant(_probe(_long_prompts("3bit_nc", 3), "piecewise", "PIECEWISE graphs",
                               compilation_config={"cudagraph_mode": "PIECEWISE"})),
    _without_turboquant(_probe(_arrivals("4bit_nc", "mtp"), "piecewise", "PIECEWISE graphs",
                               compilation_config={"cudagraph_mode": "PIECEWISE"})),
    # The other preset and K of the long-prompt and arrival scenarios.
    replace(_long_prompts("4bit_nc", 3), name="x-hybrid-tq-4bit_nc-mtp3-long"),
    replace(_long_prompts("3bit_nc", 1), name="x-hybrid-tq-3bit_nc-mtp1-long"),
    _NGRAM_ARRIVALS,
    # Its arrivals without TurboQuant: how far the hybrid's own ngram verify lands from the plain decode when
    # requests arrive while others verify.
    _without_turboquant(_NGRAM_ARRIVALS),
    # UltraQuant on a CUDA GPU: vLLM offers it only on ROCm, but an explicitly chosen backend is validated on
    # its own terms; whether it boots and decodes here says whether its route can be proven on NVIDIA. On a
    # dense model the boundary layers keep the model's dtype, which the chosen backend refuses ("kv_cache_dtype
    # not supported"); a hybrid keeps no boundary layers, so every attention layer is UltraQuant's.
    _single_probe("llama-uq", "Llama 6 layers, UltraQuant 4-bit, backend chosen explicitly", LLAMA6,
                  kv_cache_dtype="ultraquant_4bit", dtype="bfloat16",
                  attention_config={**COMMON["attention_config"], "backend": "ULTRAQUANT"}),
    _single_probe("hybrid-uq", "Qwen3-Next hybrid, UltraQuant 4-bit, backend chosen explicitly", QWEN3_NEXT12_MTP,
                  kv_cache_dtype="ultraquant_4bit", dtype="bfloat16",
                  attention_config={**COMMON["attention_config"], "backend": "ULTRAQUANT"}),
    # UltraQuant's scenarios with its verify batches in the per-request loop instead of patch 0007's route.
    _route_off(_ultraquant(_combined("k8v4", "ngram"), max_num_batched_tokens=1024)),
    _route_off(_ultraquant(_arrivals("k8v4", "ngram"))),
    # TurboQuant's fallback (the route off) with MTP in the users' attention geometry: verify batches in the
    # per-request loop, the target in PIECEWISE, the drafter's decodes in FULL graphs on Model Runner V2 (0010).
    _route_off(_combined("4bit_nc", "mtp", model=QWEN3_NEXT12_G6D256_MTP)),
)

def tensor_parallel(s: Scenario, size: int = 2) -> Scenario:
    """A scenario with every engine split over `size` GPUs of one host (tensor parallel): each rank holds
    1/size of the attention and GDN heads (the users' 24/4 heads of 256 become 12/2 per rank at TP=2) and an
    all-reduce joins the ranks after each layer; every rank takes the multi-query route's one agreed verdict."""
    def split(e: Engine | None) -> Engine | None:
        return None if e is None else replace(e, kwargs={**e.kwargs, "tensor_parallel_size": size})

    return replace(s, name=f"{s.name}-tp{size}", title=f"{s.title}; tensor parallel over {size} GPUs",
                   test=split(s.test), reference=split(s.reference), calibration=split(s.calibration),
                   control=(split(s.control[0]), split(s.control[1])) if s.control else None)


# The users' configuration split over two GPUs (2x RTX 3090/4090/A5000 at TP=2): on a two-GPU host only, so
# selected by name (`--scenarios` with a -tp2 name, or `tp2` for all of them), never by default.
_USERS_TP2 = tuple(_combined(preset, "mtp", k=k, model=QWEN3_NEXT12_G6D256_MTP)
                   for preset, k in (("3bit_nc", 3), ("4bit_nc", 3), ("k8v4", 3), ("3bit_nc", 1)))
TP2: tuple[Scenario, ...] = tuple(tensor_parallel(s) for s in (
    *_USERS_TP2,
    _combined("k8v4", "ngram", model=QWEN3_NEXT12_G6D256_MTP),
    *(_consumer_smem(s) for s in _USERS_TP2[:2]),
    _preemption("mtp"),
    _consumer_smem(_preemption("mtp")),
    _arrivals("4bit_nc", "mtp"),
    # club-3090's report: a rank-1 illegal address in a long MTP run with async scheduling at TP=2.
    _long_prompts("3bit_nc", 3),
    _long_prompts("4bit_nc", 1),
    twin(_combined("4bit_nc", "mtp", model=QWEN3_NEXT12_G6D256_MTP)),
    # The users' preset at a consumer card's tiles, judged exactly (the forced oracle's own reference is too
    # noisy at TP=2 for the combined workloads of this model).
    twin(_consumer_smem(_USERS_TP2[0])),
    # The rest of the combined configurations, judged exactly for the same reason: k8v4 with MTP and with ngram,
    # MTP K=1, and requests that join mid-decode (arrivals keyed to engine steps, so both twins batch alike).
    twin(_USERS_TP2[2]),
    twin(_combined("k8v4", "ngram", model=QWEN3_NEXT12_G6D256_MTP)),
    twin(_USERS_TP2[3]),
    twin(_arrivals("4bit_nc", "mtp")),
))

# No kernel compiled while serving (one GPU): selected by name (`--scenarios j`), never by default.
JIT: tuple[Scenario, ...] = (_jit_strict("3bit_nc", "mtp"), _jit_strict("k8v4", "ngram"),
                             *(_jit_strict(preset, "ngram", model=LLAMA6_G6D256) for preset in ("3bit_nc", "k8v4")))

# Long contexts on a 24 GB card's budget (each engine alone on its GPU): selected by name (`--scenarios l24`).
LONG_24GIB: tuple[Scenario, ...] = tuple(_long_context_24gib(preset, seqs) for preset in ("4bit_nc", "3bit_nc")
                                         for seqs in (8, 64))

BY_NAME = {s.name: s for s in (*SCENARIOS, *PROBES, *TP2, *JIT, *LONG_24GIB)}


def select(names: str | None) -> list[Scenario]:
    """Scenarios by comma-separated names or name prefixes (`a` selects both a-* scenarios); `=NAME` selects
    that scenario alone (`f-x` also selects its variants, such as `f-x-99KiB`)."""
    if not names:
        return list(SCENARIOS)
    chosen: list[Scenario] = []
    for word in (w.strip() for w in names.split(",")):
        if word == "tp2":
            chosen.extend(s for s in TP2 if s not in chosen)
            continue
        if word.startswith("="):
            hits = [BY_NAME[word[1:]]] if word[1:] in BY_NAME else []
        else:
            hits = [s for s in BY_NAME.values() if s.name == word or s.name.startswith(word + "-")]
        if not hits:
            raise ValueError(f"no scenario named {word!r}; known: {', '.join(BY_NAME)}")
        chosen.extend(h for h in hits if h not in chosen)
    return chosen
