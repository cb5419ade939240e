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

import vllm_tree

HQ, HK, D = 24, 4, 256
VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"

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
