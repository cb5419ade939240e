"""How a TurboQuant or UltraQuant speculative-decoding verify batch is served, judged by behaviour alone (the
line's patches 0001 and 0003).

These tests use only what any vLLM's TurboQuant backend offers: ``TurboQuantAttentionBackend`` (or
``UltraQuantAttentionBackend``), its builder class (``get_builder_cls``: graph support, ``build``) and impl class
(``get_impl_cls``: ``__init__``, ``forward``), the cache layout ``(blocks, Hk, block_size, slot)`` and vLLM's own
``CommonAttentionMetadata``. The backend file runs with the tree's real kernels, whatever modules it imports them
from (``tq_harness.load_backend``), so the tests judge a newer vLLM that solved the problem its own way as well as
this line: they are the patches' ``Obsolete-If: test`` checks. Outputs are compared with a float64 reference over
K/V dequantized from the cache bytes. UltraQuant (``ultraquant_4bit``, ``tq_harness.load_ultraquant_backend``)
runs its backend file on top of TurboQuant's, its cache packed and read with the tree's own format; its one
kernel, which Triton's interpreter cannot run, is an exact stand-in of the kernel's contract: whichever rows,
lengths and block tables the route hands it, it attends over exactly those.

1. FULL CUDA graphs for verify batches (the builder reports UNIFORM_BATCH with K = 3 draft tokens) are only safe
   when a verify batch is attended to from the device lengths: a FULL graph replays one launch sequence with
   new device tensors, and the host-side lengths (0.33's ``seq_lens_cpu_upper_bound``, ``max_seq_len``) are an
   optimistic upper bound under async scheduling. The release reports UNIFORM_BATCH but serves verify rows with
   a host-driven per-request loop whose causal lengths come from the host bound; patch 0001 alone gives the loop
   device lengths but takes verify batches out of FULL graphs. UltraQuant shares TurboQuant's builder and
   forward and has its own loop: on the line (0003 gives it no multi-query kernel) it keeps 0001's answer.
2. Reads: a verify batch reads each request's cache about once per KV head (the release and 0001 read it once
   per query row and query head: K+1 times G), counted in Triton's interpreter.

The tree is ``v033_tree`` (conftest.py): an ``Obsolete-If: test`` check's unpatched newer tree where the tool
names one in ``$VLLM_PATCH_BASE_UNDER_TEST``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import tq_harness

import vllm_tree
from references import TQLayout, build_tq_cache, tq_verify_ref, tq_verify_rows

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"),
    pytest.mark.patch("turboquant-full-cudagraphs-with-speculative-decoding", "turboquant-multi-query-verify-kernel"),
]

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CENTROIDS = "vllm/model_executor/layers/quantization/turboquant/centroids.py"
K = 3  # draft tokens: verify requests have K + 1 query rows
K1 = K + 1
HK, GROUP, D, BLOCK = 2, 2, 64, 16
HQ = HK * GROUP
SCALE = 1 / math.sqrt(D)
# Three verify requests whose contexts span 2 to 4 cache blocks (the K + 1 new tokens included, already stored).
LENS = [37, 54, 23]
# The host bound under async scheduling: every draft of the previous step assumed accepted (at most K more).
HOST_EXCESS = [2, 3, 1]
# Float16 outputs (tests/lines/v0_20/kernels/test_turboquant_mq_verify.py explains the bound); UltraQuant's
# bfloat16 outputs of its exact stand-in kernel round by at most 2^-9 relative.
TOL = dict(atol=3e-3, rtol=1e-2)
UQ = "ultraquant_4bit"
# The presets the route checks of patch 0001 run on: its TurboQuant and UltraQuant halves.
ROUTE_PRESETS = ["turboquant_k8v4", "turboquant_4bit_nc", UQ]


@pytest.fixture(scope="module")
def tree(v033_tree) -> Path:
    return v033_tree


@pytest.fixture(scope="module")
def config():
    return tq_harness.vllm_config(K, HQ, splits=2)


@pytest.fixture(scope="module")
def tq(tree, config):
    return tq_harness.load_backend(tree, config)


@pytest.fixture(scope="module")
def uq(tree, config, tq):
    return tq_harness.load_ultraquant_backend(tree, config, tq)


def _backend(request, preset: str) -> type | None:
    """The attention backend class that serves ``preset`` in the tree; None for UltraQuant on a tree without it
    judged as an Obsolete-If check (nothing left to fix: the check passes; the line's own runs skip it)."""
    if preset == UQ:
        if not tq_harness.ultraquant_or_obsolete(request.getfixturevalue("tree")):
            return None
        return request.getfixturevalue("uq").UltraQuantAttentionBackend
    return request.getfixturevalue("tq").TurboQuantAttentionBackend


def _dtype(preset: str) -> torch.dtype:
    return torch.bfloat16 if preset == UQ else torch.float16  # UltraQuant serves bfloat16 models only


def _spec(preset: str) -> SimpleNamespace:
    """The layer's KV cache spec as far as the backend reads it."""
    mode = SimpleNamespace(name=preset.upper(), is_turboquant=preset.startswith("turboquant_"),
                           is_ultraquant=preset == UQ)
    return SimpleNamespace(num_kv_heads=HK, head_size=D, block_size=BLOCK, dtype=torch.uint8, kv_quant_mode=mode)


@dataclasses.dataclass
class VerifyBatch:
    keys: list[torch.Tensor]  # per request (L, Hk, D), dequantized from the cache bytes
    values: list[torch.Tensor]
    storage: torch.Tensor  # 0.33's (blocks, Hk, block_size, slot)
    block_table: torch.Tensor  # as wide as the runner's, 0 (the null block) past each request
    query: torch.Tensor  # (B * K1, Hq, D)


def _batch(tree: Path, preset: str, seed: int = 0) -> VerifyBatch:
    if preset == UQ:
        cache = tq_harness.build_uq_cache(tree, LENS, HK, D, BLOCK, DEVICE, seed=seed)
    else:
        bits = TQLayout.from_preset(preset, D).centroid_bits
        centroids = vllm_tree.load_module(tree, CENTROIDS).get_centroids(D, bits)
        cache = build_tq_cache(preset, LENS, HK, D, BLOCK, DEVICE, seed=seed, centroids=centroids)
    storage = cache.kv_cache.permute(0, 2, 1, 3).contiguous()
    table = torch.zeros(len(LENS), cache.block_table.shape[1] + 4, dtype=torch.int32, device=DEVICE)
    table[:, : cache.block_table.shape[1]] = cache.block_table
    query = torch.randn(len(LENS) * K1, HQ, D, generator=torch.Generator().manual_seed(seed + 1)).to(_dtype(preset))
    return VerifyBatch(cache.keys, cache.values, storage, table, query.to(DEVICE))


def _common(tq, batch: VerifyBatch, host_excess) -> object:
    """vLLM's CommonAttentionMetadata of the verify batch as the runner builds it: exact device tensors;
    the host-side copies of the lengths (every ``seq_lens*cpu*`` field this vLLM has, and ``max_seq_len``)
    ``host_excess`` tokens larger per request."""
    cam_cls = tq.CommonAttentionMetadata
    b = len(LENS)
    qsl = torch.arange(b + 1, dtype=torch.int32) * K1
    seq = torch.tensor(LENS, dtype=torch.int32)
    host = seq + torch.tensor(host_excess, dtype=torch.int32)
    pos = (seq[:, None] + torch.arange(-K1, 0)).to(DEVICE)
    rows = torch.arange(b, device=DEVICE)[:, None]
    slots = batch.block_table[rows, pos // BLOCK].long() * BLOCK + pos % BLOCK
    kw = dict(query_start_loc=qsl.to(DEVICE), query_start_loc_cpu=qsl, seq_lens=seq.to(DEVICE), num_reqs=b,
              num_actual_tokens=b * K1, max_query_len=K1, max_seq_len=int(host.max()),
              block_table_tensor=batch.block_table, slot_mapping=slots.reshape(-1))
    for field in dataclasses.fields(cam_cls):
        if re.match(r"_?seq_lens\w*cpu", field.name) and field.init:
            kw[field.name] = host.clone()
    return cam_cls(**kw)


def _forward(tq, config, preset: str, batch: VerifyBatch, host_excess,
             backend: type | None = None) -> tuple[object, torch.Tensor]:
    """(graph support the builder reports, the impl's output) for the verify batch, built and run as vLLM does
    by ``backend`` (TurboQuant's by default)."""
    backend = backend or tq.TurboQuantAttentionBackend
    builder_cls = backend.get_builder_cls()
    support = builder_cls.get_cudagraph_support(config, _spec(preset))
    builder = builder_cls(_spec(preset), ["model.layers.0.self_attn.attn"], config, DEVICE)
    meta = builder.build(0, _common(tq, batch, host_excess))
    impl = backend.get_impl_cls()(num_heads=HQ, head_size=D, scale=SCALE, num_kv_heads=HK, alibi_slopes=None,
                                  sliding_window=None, kv_cache_dtype=preset)
    n = batch.query.shape[0]
    out = torch.full((n, HQ * D), float("nan"), dtype=_dtype(preset), device=DEVICE)
    kv = torch.zeros(n, HK, D, dtype=_dtype(preset), device=DEVICE)
    layer = SimpleNamespace()  # forward derives the rotation and centroids it keeps on the layer
    got = impl.forward(layer, batch.query, kv, kv, tq_harness.forward_cache(tq, batch.storage), meta, output=out)
    return support, got.view(n, HQ, D)


def _reference(batch: VerifyBatch) -> torch.Tensor:
    want, _ = tq_verify_ref(batch.query, batch.keys, batch.values, LENS, K1, SCALE)
    assert min(tq_verify_rows(LENS, K1)[0]) > 0
    return want


def _mismatch(out: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when out matches the reference within TOL, else which rows do not and by how much."""
    close = torch.isclose(out.float(), want, **TOL) & ~out.isnan()
    if bool(close.all()):
        return None
    bad = (~close).flatten(1).any(1).nonzero().flatten().tolist()
    err = (out.float() - want).abs().nan_to_num(float("inf")).max().item()
    return (f"{len(bad)} of {out.shape[0]} query rows differ from the causal reference over the device lengths "
            f"(rows {bad}; largest error {err:.3g})")


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_4bit_nc"])
def test_verify_batches_run_in_full_graphs_from_device_lengths(tq, config, tree, preset):
    """With K = 3 the builder reports (at least) UNIFORM_BATCH, i.e. FULL graphs for K+1 verify batches, and a
    uniform verify batch whose host-side lengths are the optimistic bound gives the causal attention of the
    device lengths."""
    batch = _batch(tree, preset)
    support, out = _forward(tq, config, preset, batch, HOST_EXCESS)
    problems = []
    uniform = type(support).UNIFORM_BATCH
    if support.value < uniform.value:
        problems.append(f"the builder reports {support.name} with K={K}: verify batches of K+1={K1} rows get no "
                        f"FULL CUDA graphs (they need {uniform.name})")
    wrong = _mismatch(out, _reference(batch))
    if wrong:
        problems.append(f"with host-side lengths {HOST_EXCESS} tokens over the device ones (the async "
                        f"spec-decode upper bound): {wrong}")
    assert not problems, f"{preset}: " + "; ".join(problems)


@pytest.mark.parametrize("preset", ROUTE_PRESETS)
def test_verify_rows_attend_over_the_device_lengths(request, tq, config, tree, preset):
    """Patch 0001's causal lengths, on any route: a verify batch whose host-side lengths are the optimistic
    bound of async scheduling is attended to over the exact device lengths."""
    backend = _backend(request, preset)  # first: it skips UltraQuant where the tree has none
    if backend is None:
        return
    batch = _batch(tree, preset)
    _, out = _forward(tq, config, preset, batch, HOST_EXCESS, backend)
    wrong = _mismatch(out, _reference(batch))
    assert wrong is None, f"{preset}, host-side lengths {HOST_EXCESS} tokens over the device ones: {wrong}"


@pytest.mark.parametrize("preset", ROUTE_PRESETS)
def test_full_graphs_only_for_a_route_that_reads_no_host_length(request, tq, config, tree, preset):
    """Patch 0001's graph safety, however it is reached: verify batches of K+1 rows stay out of FULL CUDA
    graphs (the builder reports less than UNIFORM_BATCH), or the route they take gives the device lengths'
    attention when the host-side lengths are wrong (a replayed graph sees only the device tensors change).
    q_len = 1 decodes keep FULL graphs either way."""
    backend = _backend(request, preset)
    if backend is None:
        return
    batch = _batch(tree, preset)
    support, out = _forward(tq, config, preset, batch, HOST_EXCESS, backend)
    uniform = type(support).UNIFORM_BATCH
    builder_cls = backend.get_builder_cls()
    plain = builder_cls.get_cudagraph_support(tq_harness.vllm_config(None, HQ, splits=2), _spec(preset))
    assert plain.value >= type(plain).UNIFORM_SINGLE_TOKEN_DECODE.value, f"{preset}: decodes lose FULL graphs"
    if support.value >= uniform.value:
        wrong = _mismatch(out, _reference(batch))
        assert wrong is None, (f"{preset}: the builder reports {support.name} with K={K} (FULL graphs for verify "
                               f"batches) but the route reads the host-side lengths: {wrong}")


# The bytes a verify batch of K+1 = 4 rows and G = 2 query heads per KV head (4-bit MSE keys and values) loads
# from the cache, over the bytes of its requests' used blocks (all KV heads; 20160 B here), measured under
# Triton's interpreter with 0.33.0: the line's multi-query kernel 0.79x (15960 B: each used token's slot exactly
# once per KV head, the blocks' unused tail never); the release's and patch 0001's per-request loop 17.2x
# (346896 B: the decode kernel reads every visible token once per query row and query head, K+1 times G = 8,
# and a 4-bit field once per coordinate). The bound sits between them with a wide margin either way. (3-bit
# fields straddle bytes, which the kernels load once per coordinate: the line's kernel loads 2.1x (K3V4) and
# 3.8x (3-bit) of the used blocks, hence 4-bit here.)
MAX_READ = 1.5


def skip_unless_interpreted() -> None:
    if not vllm_tree.interpreted() or DEVICE != "cpu":
        pytest.skip("counts the loads of Triton's interpreter on host memory (TRITON_INTERPRET=1, no GPU)")


def read_excess(read: int, storage: torch.Tensor, lens: list[int]) -> str | None:
    """None when the bytes ``read`` from the cache ``storage`` are at most MAX_READ x the used blocks of
    requests of ``lens`` tokens (all KV heads), else how much more."""
    used = sum(math.ceil(n / BLOCK) for n in lens) * BLOCK * HK * storage.shape[-1]
    assert read > 0, "no Triton load read the cache: the forward ran no interpreted kernel over it"
    if read <= MAX_READ * used:
        return None
    return (f"read {read} B from the cache, {read / used:.2f}x the {used} B of its requests' used blocks "
            f"(at most {MAX_READ}x)")


def test_verify_batch_reads_each_kv_block_once_per_kv_head(tq, config, tree):
    skip_unless_interpreted()
    preset = "turboquant_4bit_nc"
    batch = _batch(tree, preset, seed=3)
    with tq_harness.interpreted_loads(batch.storage) as read:
        _, out = _forward(tq, config, preset, batch, [0] * len(LENS))
    excess = read_excess(read[0], batch.storage, LENS)
    assert excess is None, (f"the verify batch {excess}: each request's cache once per KV head, not once per "
                            f"query row (K+1={K1}) and query head (G={GROUP})")
    assert _mismatch(out, _reference(batch)) is None
