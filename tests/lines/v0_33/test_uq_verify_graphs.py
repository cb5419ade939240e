"""UltraQuant decode and spec-verify batches in FULL CUDA graphs (the line's patch 0007).

UltraQuant (``ultraquant_4bit``) runs its backend file on top of TurboQuant's (``tq_harness.load_ultraquant_backend``):
its builder is TurboQuant's, its cache is packed and read with the tree's own format. Its attention kernel,
``ultraquant_unified_attention``, takes each request's rows and length from the device ``query_start_loc`` and
``seq_lens``; the host arguments (``max_query_len``, ``max_seq_len``, ``num_kv_splits``, ``force_2d``) pick the
kernel (2D, or split-KV 3D and its reduce), its tiles and KV segments. Triton's interpreter has no
``tl.dot_scaled``, so on a CPU host the kernels are ``tq_harness.uq_kernel_stand_in``: the tree's own launcher, each
program it launches computed in float64 from that launch's arguments; on a GPU with FP8 (sm_89 or newer) the last
test runs the tree's own kernel and checks the stand-in against it. Outputs are compared with plain float64
attention over the K/V dequantized from the cache bytes (``_reference``), which shares nothing with the stand-in.

1. With K = 3 the builder reports UNIFORM_BATCH (FULL graphs for verify batches of K+1 rows), and a verify
   batch whose host-side lengths are the optimistic bound of async scheduling gets the causal attention of the
   device lengths. The release reports UNIFORM_BATCH over a loop that reads the host lengths; patch 0001 alone
   keeps the loop and takes verify batches out of FULL graphs.
2. A FULL graph replays the launches of its capture: the route launches the kernel once for the whole batch,
   with the same arguments for every batch of one shape, whatever its lengths (the release and 0001 launch once
   per request, with each request's host lengths).
3. Decodes of different lengths (an ngram request without a match, a partial draft) take the same one launch.
4. On Model Runner V2 the drafter's K-1 decode steps share one metadata refreshed in place, and one CUDA graph
   (patch 0005's interface): the builder claims it, and draft step 2 on step 1's metadata, its device lengths
   advanced in place, gives what metadata built for step 2 gives, bit for bit.
5. The stand-in follows its launch arguments: whichever kernel, tiles, KV segments, sliding window or sinks they
   give, it computes what that launch computes.
6. On a GPU: the tree's kernel, launched as the route launches it (one KV split and several), gives the causal
   attention of its FP8 queries within bfloat16 rounding, and the same comparison tells a row that sees one
   token too few; the stand-in, run by the route on the same batch, gives what the kernel gives.
"""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest
import test_tq_draft_decode_update as draft_update
import test_tq_verify_route as route
import torch
import tq_harness

pytestmark = pytest.mark.patch("ultraquant-verify-in-full-cudagraphs")

K, K1, HK, HQ, D, BLOCK, SCALE = route.K, route.K1, route.HK, route.HQ, route.D, route.BLOCK, route.SCALE
DEVICE, UQ, _spec, _mismatch = route.DEVICE, route.UQ, route._spec, route._mismatch
tree, config, tq = route.tree, route.config, route.tq

# Decodes of different lengths: a full verify row, an ngram request without a match, a full row, a partial draft.
RAGGED_LENS = [37, 54, 23, 41]
RAGGED_QUERY_LENS = [4, 1, 4, 2]
RAGGED_EXCESS = [2, 3, 1, 2]


@pytest.fixture(scope="module")
def uq(tree, config, tq):
    tq_harness.skip_without_ultraquant(tree)
    return tq_harness.load_ultraquant_backend(tree, config, tq)


@dataclasses.dataclass
class Batch:
    cache: SimpleNamespace  # build_uq_cache: kv_cache (blocks, block_size, Hk, slot), block_table, keys, values
    lens: list[int]
    query_lens: list[int]
    query: torch.Tensor  # (sum(query_lens), Hq, D) bfloat16, request-major


def _batch(tree, lens: list[int], query_lens: list[int], seed: int = 0, device: str = DEVICE) -> Batch:
    cache = tq_harness.build_uq_cache(tree, lens, HK, D, BLOCK, device, seed=seed)
    query = torch.randn(sum(query_lens), HQ, D, generator=torch.Generator().manual_seed(seed + 1))
    return Batch(cache, lens, query_lens, query.to(torch.bfloat16).to(device))


def _common(tq, batch: Batch, host_excess: list[int]):
    """vLLM's CommonAttentionMetadata of the batch: exact device tensors, host-side lengths ``host_excess`` over."""
    cam_cls = tq.CommonAttentionMetadata
    b, device = len(batch.lens), batch.query.device
    ql = torch.tensor(batch.query_lens, dtype=torch.int32)
    qsl = torch.zeros(b + 1, dtype=torch.int32)
    qsl[1:] = ql.cumsum(0)
    seq = torch.tensor(batch.lens, dtype=torch.int32)
    host = seq + torch.tensor(host_excess, dtype=torch.int32)
    table = torch.zeros(b, batch.cache.block_table.shape[1] + 4, dtype=torch.int32, device=device)
    table[:, : batch.cache.block_table.shape[1]] = batch.cache.block_table
    pos = torch.cat([torch.arange(n - q, n) for n, q in zip(batch.lens, batch.query_lens, strict=True)]).to(device)
    req = torch.repeat_interleave(torch.arange(b), ql).to(device)
    slots = table[req, pos // BLOCK].long() * BLOCK + pos % BLOCK
    kw = dict(query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq.to(device), num_reqs=b,
              num_actual_tokens=int(qsl[-1]), max_query_len=int(ql.max()), max_seq_len=int(host.max()),
              block_table_tensor=table, slot_mapping=slots)
    for field in dataclasses.fields(cam_cls):
        if re.match(r"_?seq_lens\w*cpu", field.name) and field.init:
            kw[field.name] = host.clone()
    return cam_cls(**kw)


def _forward(tq, uq, vllm_config, batch: Batch, host_excess: list[int],
             cache_launches: list | None = None) -> tuple[object, torch.Tensor]:
    """(graph support the builder reports, the impl's output) of UltraQuant's builder and impl on the batch;
    ``cache_launches`` gets the Triton launches handed the cache (``tq_harness.cache_launches``)."""
    backend = uq.UltraQuantAttentionBackend
    builder_cls = backend.get_builder_cls()
    support = builder_cls.get_cudagraph_support(vllm_config, _spec(UQ))
    builder = builder_cls(_spec(UQ), ["model.layers.0.self_attn.attn"], vllm_config, batch.query.device)
    meta = builder.build(0, _common(tq, batch, host_excess))
    impl = backend.get_impl_cls()(num_heads=HQ, head_size=D, scale=SCALE, num_kv_heads=HK, alibi_slopes=None,
                                  sliding_window=None, kv_cache_dtype=UQ)
    n = batch.query.shape[0]
    out = torch.full((n, HQ * D), float("nan"), dtype=torch.bfloat16, device=batch.query.device)
    kv = torch.zeros(n, HK, D, dtype=torch.bfloat16, device=batch.query.device)
    storage = batch.cache.kv_cache.permute(0, 2, 1, 3).contiguous()
    with tq_harness.cache_launches(storage) as launched:
        got = impl.forward(SimpleNamespace(), batch.query, kv, kv, tq_harness.forward_cache(tq, storage), meta,
                           output=out)
    if cache_launches is not None:
        cache_launches.extend(launched)
    return support, got.view(n, HQ, D)


def _reference(batch: Batch, query: torch.Tensor | None = None, shift: int = 0, window: int = 0,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Plain float64 attention of ``query`` (the batch's by default), from the K/V dequantized from the cache bytes
    (``build_uq_cache``'s ``keys``, ``values``: unrotated): row i of request r (q_r rows) sees the first
    lens[r] - q_r + 1 + i tokens (``shift`` more: a known wrong answer), only the last ``window`` of them with a
    sliding window, and ``sinks[h]`` adds exp(sinks[h]) to head h's softmax denominator. Float32 (N, Hq, D)."""
    q = (batch.query if query is None else query).double()
    out = torch.full(q.shape, float("nan"), dtype=torch.float64, device=q.device)
    group, row = HQ // HK, 0
    for r, (n, q_len) in enumerate(zip(batch.lens, batch.query_lens, strict=True)):
        keys = batch.cache.keys[r].double().repeat_interleave(group, dim=1)  # (L, Hq, D)
        values = batch.cache.values[r].double().repeat_interleave(group, dim=1)
        for i in range(q_len):
            end = n - q_len + 1 + i + shift
            start = max(0, end - window) if window else 0
            scores = torch.einsum("hd,nhd->hn", q[row], keys[start:end]) * SCALE
            v = values[start:end]
            if sinks is not None:
                scores = torch.cat([scores, sinks.double()[:, None].to(q.device)], dim=1)
                v = torch.cat([v, torch.zeros_like(v[:1])])
            out[row] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
            row += 1
    return out.float()


def test_verify_batches_run_in_full_graphs_from_device_lengths(tq, uq, config, tree):
    batch = _batch(tree, route.LENS, [K1] * len(route.LENS))
    support, out = _forward(tq, uq, config, batch, route.HOST_EXCESS)
    problems = []
    uniform = type(support).UNIFORM_BATCH
    if support.value < uniform.value:
        problems.append(f"the builder reports {support.name} with K={K}: verify batches of K+1={K1} rows get no "
                        f"FULL CUDA graphs (they need {uniform.name})")
    wrong = _mismatch(out, _reference(batch))
    if wrong:
        problems.append(f"with host-side lengths {route.HOST_EXCESS} over the device ones: {wrong}")
    assert not problems, "ultraquant_4bit: " + "; ".join(problems)


def _launches(uq, monkeypatch) -> list[dict]:
    """Records every call of the backend's kernel: its arguments, tensors as their shapes, and (``kernels``) the
    kernel launches it made: which kernel, its grid and constexprs."""
    calls: list[dict] = []
    kernel = uq.ultraquant_unified_attention

    def recording(*args, **kwargs):
        names = ("query", "kv_cache", "block_table", "seq_lens", "query_start_loc", "scale")
        bound = {**dict(zip(names, args, strict=False)), **kwargs}
        call = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else v for k, v in bound.items()}
        before = len(kernel.launches)
        try:
            return kernel(*args, **kwargs)
        finally:
            call["kernels"] = [{k: v for k, v in launch.items() if k != "scale"}
                               for launch in kernel.launches[before:]]
            calls.append(call)

    monkeypatch.setattr(uq, "ultraquant_unified_attention", recording)
    return calls


def test_one_launch_per_batch_fixed_by_its_shape(tq, uq, config, tree, monkeypatch):
    """Two verify batches of one shape (3 requests of K+1 rows), other lengths and host bounds: one call of the
    kernel each, with the same arguments and so the same kernel launches (kernel, grid, tiles, KV segments), as a
    FULL graph captured on one replays it for the other."""
    calls = _launches(uq, monkeypatch)
    launches = []
    for lens, excess, seed in ((route.LENS, route.HOST_EXCESS, 0), ([44, 60, 20], [0, 3, 3], 4)):
        batch = _batch(tree, lens, [K1] * len(lens), seed=seed)
        calls.clear()
        _, out = _forward(tq, uq, config, batch, excess)
        assert _mismatch(out, _reference(batch)) is None, f"lengths {lens}: not the causal attention"
        launches.append(list(calls))
    first, second = launches
    assert len(first) == 1 and len(second) == 1, (
        f"the verify batch launches the kernel {len(first)} and {len(second)} times: once per request, from host "
        f"lengths, not once for the batch")
    differ = {k: (first[0].get(k), second[0].get(k)) for k in {*first[0], *second[0]}
              if k != "scale" and first[0].get(k) != second[0].get(k)}
    assert not differ, f"batches of one shape launch the kernel differently (a graph would replay the first): {differ}"


def test_decodes_of_different_lengths_in_one_launch(tq, uq, config, tree, monkeypatch):
    calls = _launches(uq, monkeypatch)
    batch = _batch(tree, RAGGED_LENS, RAGGED_QUERY_LENS, seed=2)
    _, out = _forward(tq, uq, config, batch, RAGGED_EXCESS)
    wrong = _mismatch(out, _reference(batch))
    assert wrong is None, f"decodes of {RAGGED_QUERY_LENS} tokens: {wrong}"
    assert len(calls) == 1, f"decodes of {RAGGED_QUERY_LENS} tokens launch the kernel {len(calls)} times, not once"


def test_draft_steps_share_metadata_refreshed_in_place(tq, uq, config, tree):
    if not draft_update._speculators_update_in_place(tree):
        pytest.skip("this vLLM's speculators rebuild the draft metadata before every step, whatever the backend")
    builder = uq.UltraQuantAttentionBackend.get_builder_cls()(_spec(UQ), ["model.layers.0.self_attn.attn"], config,
                                                              DEVICE)
    assert getattr(builder, "supports_draft_decode_metadata_update", False), (
        f"the UltraQuant builder cannot update draft decode metadata in place, so on Model Runner V2 each of the "
        f"K-1={K - 1} draft decode steps rebuilds its attention metadata on the host and replays a graph of its own")
    lens = [37, 54, 23]
    step2 = _batch(tree, [n + 1 for n in lens], [1] * len(lens), seed=6)  # the cache holds step 2's tokens
    meta = builder.build(0, _common(tq, dataclasses.replace(step2, lens=lens), [0] * len(lens)))
    meta.seq_lens += 1  # the speculator's advance, in place
    builder.update_draft_decode_metadata(meta)
    impl = uq.UltraQuantAttentionBackend.get_impl_cls()(num_heads=HQ, head_size=D, scale=SCALE, num_kv_heads=HK,
                                                         alibi_slopes=None, sliding_window=None, kv_cache_dtype=UQ)
    storage = tq_harness.forward_cache(tq, step2.cache.kv_cache.permute(0, 2, 1, 3).contiguous())
    n = step2.query.shape[0]

    def forward(m) -> torch.Tensor:
        out = torch.full((n, HQ * D), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        kv = torch.zeros(n, HK, D, dtype=torch.bfloat16, device=DEVICE)
        return impl.forward(SimpleNamespace(), step2.query, kv, kv, storage, m, output=out).view(n, HQ, D)

    in_place = forward(meta)
    fresh = forward(builder.build(0, _common(tq, step2, [0] * len(lens))))
    assert torch.equal(in_place, fresh), "draft step 2 on step 1's metadata refreshed in place differs from fresh"
    assert _mismatch(in_place, _reference(step2)) is None


# The stand-in called directly on decodes of different lengths, with launch arguments that give each kernel: the
# split-KV 3D kernel (max_query_len 1, max_seq_len >= 1024, not force_2d) with 8, 4 (tile 32) and 2 (sliding window)
# KV segments, the 2D kernel forced, under a short max_seq_len and for prefill-like rows; with sinks in both.
STAND_IN_LAUNCHES = [
    dict(max_query_len=1, max_seq_len=4096, num_kv_splits=8),
    dict(max_query_len=1, max_seq_len=4096, num_kv_splits=4, tile_size=32, sinks=True),
    dict(max_query_len=1, max_seq_len=2048, num_kv_splits=2, sliding_window=20),
    dict(max_query_len=1, max_seq_len=4096, num_kv_splits=8, force_2d=True, sinks=True),
    dict(max_query_len=1, max_seq_len=57, num_kv_splits=8),
    dict(max_query_len=4, max_seq_len=4096, num_kv_splits=8, sliding_window=9),
]


def test_the_kernel_stand_in_follows_its_launch_arguments(tree):
    tq_harness.skip_without_ultraquant(tree)
    stand_in = tq_harness.uq_kernel_stand_in(tree).ultraquant_unified_attention
    batch = _batch(tree, RAGGED_LENS, RAGGED_QUERY_LENS, seed=8)
    c = batch.cache
    qsl = torch.zeros(len(batch.lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(batch.query_lens).cumsum(0)
    sinks = torch.linspace(-1.0, 2.0, HQ, device=DEVICE)
    kernels = set()
    for launch in STAND_IN_LAUNCHES:
        kw = {**launch, "sinks": sinks if launch.get("sinks") else None}
        out = torch.full_like(batch.query, float("nan"))
        before = len(stand_in.launches)
        stand_in(batch.query, c.kv_cache, c.block_table, torch.tensor(batch.lens, dtype=torch.int32, device=DEVICE),
                 qsl.to(DEVICE), SCALE, output=out, **kw)
        ran = stand_in.launches[before:]
        kernels |= {(r["kernel"], r.get("NUM_SEGMENTS_PER_SEQ"), r["TILE_SIZE"], r.get("BLOCK_M")) for r in ran}
        want = _reference(batch, window=launch.get("sliding_window", 0), sinks=kw["sinks"])
        wrong = _mismatch(out, want)
        assert wrong is None, f"{launch} ({[r['kernel'] for r in ran]}): {wrong}"
        assert _mismatch(out, _reference(batch, shift=-1, window=launch.get("sliding_window", 0),
                                         sinks=kw["sinks"])) is not None, f"{launch}: one token fewer passes"
    names = {k for k, *_ in kernels}
    assert {"kernel_ultraquant_unified_attention_2d", "kernel_ultraquant_unified_attention_3d",
            "reduce_segments"} <= names, f"the launches ran only {sorted(names)}"
    assert len({segments for k, segments, *_ in kernels if k.endswith("_3d")}) >= 3, kernels
    assert len({(tile, block_m) for k, _, tile, block_m in kernels if k.endswith("_2d")}) >= 2, kernels


def _fp8_query(batch: Batch, tree) -> torch.Tensor:
    """The batch's queries as the kernel attends with them: rotated, rounded to FP8 E4M3, rotated back."""
    from vllm_tree import load_module
    h = load_module(tree, tq_harness.UQ_REFERENCE).hadamard_matrix(D, batch.query.device, torch.float32)
    rotated = (batch.query.float() @ h).to(torch.float8_e4m3fn).float()
    return rotated.double() @ h.double()


@pytest.mark.parametrize("splits", [1, 8])
def test_the_route_on_the_gpu_gives_the_causal_attention(tq, tree, splits):
    """The tree's kernel as the route launches it: 2D with one KV split, the split-KV (3D) kernel with 8. The
    stand-in, run by the same route on the same batch, makes the launches over the cache the kernel makes (kernel
    and grid) and gives the causal attention of the exact queries, as the kernel does of its FP8 queries."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("UltraQuant's kernel needs a CUDA GPU with FP8 (sm_89 or newer)")
    tq_harness.skip_without_ultraquant(tree)
    gpu_config = tq_harness.vllm_config(K, HQ, splits=splits, dtype=torch.bfloat16)
    tq_gpu = tq_harness.load_backend(tree, gpu_config)
    uq_real = tq_harness.load_ultraquant_backend(tree, gpu_config, tq_gpu, real_kernel=True)
    lens, query_lens, excess = [37, 1500, 230, 41], [4, 4, 1, 3], [2, 3, 1, 2]
    batch = _batch(tree, lens, query_lens, seed=7, device="cuda")
    real_launches: list = []
    _, out = _forward(tq, uq_real, gpu_config, batch, excess, real_launches)
    fp8 = _fp8_query(batch, tree)
    wrong = _mismatch(out, _reference(batch, fp8))
    assert wrong is None, f"the kernel, {splits} KV splits, decodes of {query_lens} tokens: {wrong}"
    shifted = _reference(batch, fp8, shift=-1)
    assert _mismatch(out, shifted) is not None, "the comparison cannot tell one token fewer"
    uq_stand_in = tq_harness.load_ultraquant_backend(tree, gpu_config, tq_gpu)
    kernel = uq_stand_in.ultraquant_unified_attention
    before = len(kernel.launches)
    _, emulated = _forward(tq, uq_stand_in, gpu_config, batch, excess)
    emulated_launches = [(launch["kernel"], launch["grid"]) for launch in kernel.launches[before:]
                         if launch["kernel"] != "reduce_segments"]
    assert emulated_launches == real_launches, (
        f"{splits} KV splits: the stand-in launched {emulated_launches}, the kernel {real_launches}")
    wrong = _mismatch(emulated, _reference(batch))
    assert wrong is None, f"the stand-in, {splits} KV splits, decodes of {query_lens} tokens: {wrong}"
