"""The GDN metadata builder's state-recovery fields (patches 0004/0005), on CPU.

The patched tree's ``gdn_attn.py`` runs with stand-ins for its ``vllm.*`` imports (see
``gdn_builder_harness``); its builder's own ``__init__`` and ``build`` compute the metadata. The cases
are in ``gdn_builder_cases``; ``test_gdn_builder_gpu.py`` runs them against an installed vLLM.
With ``VLLM_PATCH_PATCHED_TREE`` set to the pristine tree these tests fail: the fields do not exist.
"""

from __future__ import annotations

import pytest

import gdn_builder_cases
from gdn_builder_harness import load_gdn_attn, make_builder

pytestmark = pytest.mark.patch(
    "gdn-recover-conv-and-ssm-state-after-spec-decode",
    "gdn-state-recovery-for-mixed-batches-and-zero-draft-rows",
)


@pytest.fixture(scope="module")
def gdn_attn(patched_tree):
    return load_gdn_attn(patched_tree)


@pytest.mark.parametrize("case", gdn_builder_cases.CASES, ids=lambda case: case.__name__)
def test_builder(case, gdn_attn):
    case(gdn_attn, lambda num_spec, **kw: make_builder(gdn_attn, num_spec, **kw), "cpu")


def test_harness_runs_the_pristine_builder(pristine_tree):
    """The stand-ins suffice for the unpatched file too, so the patched tests fail there for the patch's
    reasons (the fields are missing), not the harness's."""
    module = load_gdn_attn(pristine_tree)
    assert not hasattr(module.GDNAttentionMetadata, "spec_decode_src_indices")
    batch, md = gdn_builder_cases._mixed(lambda k: make_builder(module, k), "cpu")
    assert (md.num_spec_decodes, md.num_decodes, md.num_prefills) == (3, 0, 4)
    assert gdn_builder_cases._ints(md.num_accepted_tokens) == [2, 4, 1]
    # Pristine: the non-spec rows read block 0 whatever they accepted.
    assert gdn_builder_cases._ints(md.non_spec_state_indices_tensor) == [batch.block(r, 0) for r in (1, 3, 5, 6)]
