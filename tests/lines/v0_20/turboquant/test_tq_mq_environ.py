"""The environment variables of the multi-query kernel's route (patch 0007) are registered in vLLM's
``vllm/envs.py``, so vLLM 0.20's start-up check of the environment (``envs.validate_environ``) accepts them:
unregistered, it logs "Unknown vLLM environment variable detected" and, with ``fail_on_environ_validation``,
refuses to start. ``VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY`` (bytes of shared memory per block the tiles are sized
for, read by the kernel file through ``os.environ``) and ``VLLM_TURBOQUANT_ATTENTION_KERNEL``.
"""

from __future__ import annotations

import pytest
import vllm_environ

pytestmark = pytest.mark.patch("turboquant-multi-query-verify-kernel")


@pytest.mark.parametrize(("name", "value", "read"), [
    ("VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY", "101376", 101376),
    ("VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode", "decode"),
])
def test_vllms_environment_check_accepts_the_routes_variables(patched_tree, monkeypatch, name, value, read):
    vllm_environ.only_vllm_variables(monkeypatch)(**{name: value})
    vllm_environ.validate_environ(patched_tree, hard_fail=True)
    assert getattr(vllm_environ.envs_module(patched_tree), name) == read
