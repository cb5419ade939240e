"""The environment variables the multi-query route reads (the line's patch 0003) are registered in vLLM's
``vllm/envs.py``, so vLLM's own start-up check of the environment (``validate_environ``, see vllm_environ)
accepts them: unregistered, vLLM logs "Unknown vLLM environment variable detected" for each and, with
``fail_on_environ_validation``, refuses to start.

``VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY`` (the kernel file reads it through ``os.environ``) caps the shared
memory per block the kernel's tiles are sized for, in bytes; ``VLLM_TURBOQUANT_ATTENTION_KERNEL`` turns the
route off. Each runs through the tree's own check with nothing else of vLLM's set, and reads back through
``vllm.envs`` as the type it is registered with.
"""

from __future__ import annotations

import pytest
import vllm_environ

pytestmark = pytest.mark.patch("turboquant-multi-query-verify-kernel")

VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
MAX_SHARED = "VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY"
KERNEL = "VLLM_TURBOQUANT_ATTENTION_KERNEL"
RTX_3090 = 101376  # 99 KiB per block


@pytest.fixture
def set_only(monkeypatch):
    return vllm_environ.only_vllm_variables(monkeypatch)


def test_the_kernel_reads_the_shared_memory_cap_by_this_name(v033_tree):
    assert f'"{MAX_SHARED}"' in (v033_tree / VERIFY).read_text()


@pytest.mark.parametrize(("name", "value", "read"), [
    (MAX_SHARED, str(RTX_3090), RTX_3090),
    (KERNEL, "decode", "decode"),
])
def test_vllms_environment_check_accepts_the_routes_variables(v033_tree, set_only, name, value, read):
    set_only(**{name: value})
    vllm_environ.validate_environ(v033_tree, hard_fail=True)
    assert getattr(vllm_environ.envs_module(v033_tree), name) == read


def test_the_shared_memory_cap_is_unset_by_default(v033_tree, set_only):
    set_only()
    assert getattr(vllm_environ.envs_module(v033_tree), MAX_SHARED) is None


def test_an_unknown_variable_still_fails_the_check(v033_tree, set_only):
    """The check runs for real: a name vLLM does not know is refused."""
    set_only(VLLM_TURBOQUANT_NOT_A_SETTING="1")
    with pytest.raises(ValueError, match="Unknown vLLM environment variable detected"):
        vllm_environ.validate_environ(v033_tree, hard_fail=True)
