"""Every workspace byte TurboQuant's attention reserves is there before vLLM's memory profile ends.

vLLM sizes the KV cache from the memory the profile leaves (``determine_available_memory``) and builds the
attention metadata builders after it (``initialize_kv_cache``). The release's builder reserves its decode scratch
and, with chunked prefill, the continuation prefill's dequantized K/V of ``max_model_len`` tokens only then: bytes
the profile never saw, taken from the memory the KV cache was promised (for Qwen3.6-27B's 4 KV heads of 256 at a
262,144-token context, 1 GiB for the continuation buffers alone). The line's layers reserve the same sets when
they are built, with the model, so the builders find the workspace already large enough.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import tq_harness
from torch.utils._python_dispatch import TorchDispatchMode

import vllm_tree
from references import TQLayout, build_tq_cache, tq_verify_ref

HQ, HK, D = 24, 4, 256
VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
CENTROIDS = "vllm/model_executor/layers/quantization/turboquant/centroids.py"

pytestmark = pytest.mark.patch("turboquant-count-the-workspace-in-the-memory-profile")


@pytest.mark.parametrize("kernel", ["multi_query", "decode"])
@pytest.mark.parametrize("max_model_len", [4096, 262144])
def test_the_builders_made_after_the_profile_grow_no_workspace(v033_tree, monkeypatch, kernel, max_model_len):
    """The tree's own WorkspaceManager, locked once the layer is built (vLLM locks it only after the graph
    capture; locked here, a growth after the layer's constructor raises), then the builder made as vLLM makes it
    after the profile: at vLLM's defaults (256 sequences, 8192 batched tokens, chunked prefill, 32 KV splits),
    MTP K = 3, Qwen3.6-27B's 24/4 heads of 256, the multi-query route on or off."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    if not torch.accelerator.is_available():
        monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)  # no device cache to release
    monkeypatch.setenv("VLLM_TURBOQUANT_ATTENTION_KERNEL", kernel)
    config = tq_harness.vllm_config(3, HQ, 256, 32, 8192, dtype=torch.bfloat16, cache_dtype="turboquant_4bit_nc")
    config.scheduler_config.enable_chunked_prefill = True
    config.model_config.max_model_len = max_model_len
    tq = tq_harness.load_backend(v033_tree, config)
    manager = tq_harness.workspace_manager(v033_tree)
    monkeypatch.setattr(tq, "is_workspace_manager_initialized", lambda: True)
    monkeypatch.setattr(tq, "current_workspace_manager", lambda: manager)
    if hasattr(tq, "tq_mq_verify_split_rows"):  # the line's kernel, on an H100 (132 SMs) whose probes pass
        limits = vllm_tree.load_module(v033_tree, VERIFY).TQMQLimits(232448, 90, False)
        monkeypatch.setitem(tq.tq_mq_verify_split_rows.__globals__["_SM_COUNT"], 0, 132)
        monkeypatch.setattr(tq, "tq_mq_device_limits", lambda device=None: limits)
        monkeypatch.setattr(tq, "tq_mq_verify_probe", lambda tiles, **kw: None)
    impl = tq.TurboQuantAttentionImpl(HQ, D, 1 / 16, num_kv_heads=HK, kv_cache_dtype="turboquant_4bit_nc")
    manager.lock()
    monkeypatch.setattr(tq, "get_layers_from_vllm_config",
                        lambda config, cls, names=None: {"target": SimpleNamespace(impl=impl)})
    spec = SimpleNamespace(num_kv_heads=HK, head_size=D, block_size=16,
                           kv_quant_mode=SimpleNamespace(name="TURBOQUANT_4BIT_NC"))
    try:
        tq.TurboQuantAttentionBackend.get_builder_cls()(spec, ["target"], config, "cpu")
    except AssertionError as exc:
        if "locked" not in str(exc):
            raise
        pytest.fail(f"the builder, made after the memory profile, grew the workspace: {exc}")


class _Allocations(TorchDispatchMode):
    """Every tensor an aten op returns on storage that is neither the workspace's nor an input's, of at least
    ``min_bytes``: an allocation of the caching allocator, which vLLM's memory profile does not see when it
    happens only in a continuation prefill (the profile runs fresh prompts)."""

    def __init__(self, known: list[torch.Tensor], min_bytes: int):
        super().__init__()
        self.known = {t.untyped_storage().data_ptr() for t in known}
        self.min_bytes, self.found = min_bytes, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() >= self.min_bytes \
                    and t.untyped_storage().data_ptr() not in self.known:
                self.found.append(f"{func}: {tuple(t.shape)} {t.dtype}")
                self.known.add(t.untyped_storage().data_ptr())  # its views are not new allocations
        return out


@pytest.mark.parametrize("preset", ["4bit_nc", "k8v4"])
def test_a_continuation_prefill_takes_its_context_sized_buffers_from_the_workspace(v033_tree, monkeypatch, preset):
    """A prompt chunk after 600 cached tokens (the continuation prefill: the cached K/V dequantized, joined with the
    chunk's, attended by the chunk's 40 queries) allocates nothing the size of the context outside the workspace
    its layer reserved when it was built (the release allocates the joined K and V and, for MSE keys, the
    rotated keys on every call: about 2 KB a token each for Qwen3.6-27B's 4 KV heads of 256), and its output
    is causal attention over the dequantized cache and the chunk (float64 reference)."""
    if not torch.accelerator.is_available():
        monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)
    monkeypatch.setenv("VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode")  # the kernel's scratch aside
    hq, hk, d, cached, chunk = 8, 2, 128, 600, 40
    config = tq_harness.vllm_config(None, hq, 8, 4, 2048, dtype=torch.bfloat16, cache_dtype=f"turboquant_{preset}")
    config.scheduler_config.enable_chunked_prefill = True
    tq = tq_harness.load_backend(v033_tree, config)
    manager = tq_harness.workspace_manager(v033_tree)
    monkeypatch.setattr(tq, "is_workspace_manager_initialized", lambda: True)
    monkeypatch.setattr(tq, "current_workspace_manager", lambda: manager)
    impl = tq.TurboQuantAttentionImpl(hq, d, d ** -0.5, num_kv_heads=hk, kv_cache_dtype=f"turboquant_{preset}")
    manager.lock()  # what the layer reserved is all there is

    bits = TQLayout.from_preset(f"turboquant_{preset}", d).centroid_bits
    centroids = vllm_tree.load_module(v033_tree, CENTROIDS).get_centroids(d, bits)
    cache = build_tq_cache(preset, [cached], hk, d, 16, "cpu", seed=3, centroids=centroids)
    kv = cache.kv_cache.permute(0, 2, 1, 3).contiguous().transpose(1, 2)  # as forward hands it on
    # The FP8 key format the cache was written in (the release asks the device, which a CPU host has not).
    monkeypatch.setattr(tq, "_use_fp8_e4b15", lambda index=0: cache.fp8_e4b15)
    gen = torch.Generator().manual_seed(4)
    query, key, value = (torch.randn(chunk, h, d, generator=gen).to(torch.bfloat16) for h in (hq, hk, hk))
    layer = SimpleNamespace(_tq_Pi_half=cache.pi.half(), _tq_Pi=cache.pi, _tq_PiT=cache.pi)
    known = [kv, query, key, value, cache.block_table, cache.pi, cache.centroids,
             *(b for b in manager.__dict__.values() if isinstance(b, torch.Tensor)),
             *(b for bufs in manager.__dict__.values() if isinstance(bufs, list) for b in bufs
               if isinstance(b, torch.Tensor))]
    context_bytes = cached * hk * d * 2
    with _Allocations(known, context_bytes // 2) as allocations:
        out = impl._continuation_prefill(layer, query, key, value, kv, cache.block_table[:1], cached,
                                         cached + chunk, cache.pi, cache.centroids.float())
    keys = torch.cat([cache.keys[0], key.float()])
    values = torch.cat([cache.values[0], value.float()])
    want, _ = tq_verify_ref(query.float(), [keys], [values], [cached + chunk], chunk, d ** -0.5)
    torch.testing.assert_close(out.float(), want, atol=3e-2, rtol=3e-2)
    assert not allocations.found, f"context-sized buffers outside the workspace: {allocations.found}"
