"""The GDN state-recovery cases (patches 0004/0005) against an importable, patched vLLM (the GPU host).

The same batches as ``test_gdn_builder.py``, but built by the installed ``vllm`` package:
its ``GDNAttentionMetadataBuilder`` with its real imports, on CUDA when there is a GPU. Also checked:
the layer's SSM-state copy and the conv wrapper's new argument. Skips itself only when ``import vllm``
fails. Against an unpatched vLLM it fails, as it should.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

import gdn_builder_cases
from gdn_builder_harness import make_builder

pytest.importorskip("vllm", reason="needs an importable vLLM (the GPU host)")

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
    case(gdn_attn, lambda num_spec: make_builder(gdn_attn, num_spec, device=DEVICE, mamba_spec=mamba_spec),
         DEVICE)


def test_conv_wrapper_takes_num_accepted_tokens():
    from vllm.model_executor.layers.mamba.ops import causal_conv1d

    assert "num_accepted_tokens" in inspect.signature(causal_conv1d.causal_conv1d_fn).parameters


def test_layer_copies_ssm_state_from_accepted_block():
    from vllm.model_executor.layers.mamba import gdn_linear_attn

    ssm = torch.randn(12, 2, 4, 4, device=DEVICE)
    before = ssm.clone()
    md = SimpleNamespace(
        spec_decode_src_indices=torch.tensor([3, 5, 8], dtype=torch.int32, device=DEVICE),
        non_spec_state_indices_tensor=torch.tensor([1, 5, 6, 0, 0], dtype=torch.int32, device=DEVICE),
    )
    gdn_linear_attn._restore_accepted_ssm_state(ssm, md)
    assert torch.equal(ssm[1], before[3]) and torch.equal(ssm[5], before[5]) and torch.equal(ssm[6], before[8])
    untouched = [0, 2, 3, 4, 7, 8, 9, 10, 11]
    assert torch.equal(ssm[untouched], before[untouched])

    md.spec_decode_src_indices = None
    gdn_linear_attn._restore_accepted_ssm_state(ssm, md)  # no-op
