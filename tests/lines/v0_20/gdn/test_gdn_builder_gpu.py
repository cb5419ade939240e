"""The GDN state-recovery cases (patches 0004/0005) against an importable, patched vLLM (the GPU host).

The same batches as ``test_gdn_builder.py``, but built by the installed ``vllm`` package:
its ``GDNAttentionMetadataBuilder`` with its real imports, on CUDA when there is a GPU. Also checked:
the new arguments of the conv wrapper and the packed decode (the layer's use of them is what scenarios
c and d of tests/gpu check end to end). Skips itself only when ``import vllm`` fails. Against an
unpatched vLLM it fails, as it should.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import gdn_builder_cases
from gdn_builder_harness import make_builder

pytestmark = pytest.mark.patch(
    "gdn-recover-conv-and-ssm-state-after-spec-decode",
    "gdn-state-recovery-for-mixed-batches-and-zero-draft-rows",
)

pytest.importorskip("vllm", reason="needs an importable, patched vLLM: run on the GPU host by "
                                   "gpu/host.sh kernels; test_gdn_builder.py runs the same cases on CPU")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def gdn_attn():
    from vllm.v1.attention.backends import gdn_attn

    return gdn_attn


@pytest.fixture(scope="module")
def mamba_spec():
    from vllm.v1.kv_cache_interface import MambaSpec

    # Mode "none" only checks the type; the builder never reads its fields there.
    return object.__new__(MambaSpec)


@pytest.mark.parametrize("case", gdn_builder_cases.CASES, ids=lambda case: case.__name__)
def test_builder_installed_vllm(case, gdn_attn, mamba_spec):
    case(gdn_attn, lambda num_spec, **kw: make_builder(gdn_attn, num_spec, device=DEVICE, mamba_spec=mamba_spec, **kw),
         DEVICE)


def test_conv_wrapper_takes_num_accepted_tokens():
    from vllm.model_executor.layers.mamba.ops import causal_conv1d

    assert "num_accepted_tokens" in inspect.signature(causal_conv1d.causal_conv1d_fn).parameters


def test_packed_decode_takes_state_sources():
    from vllm.model_executor.layers.fla.ops import fused_recurrent

    params = inspect.signature(fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode).parameters
    assert "ssm_state_src_indices" in params

