"""Patch 0006 on 0.25.1: decodes without drafts stay speculative rows (tests/support/zero_draft.py).

The patch's ``Obsolete-If: test`` check: on a newer release's unpatched tree (vLLM 0.32.0 on, which routes these
rows so, vllm PR #56531) the same tests run that tree's own runner and GDN builder. The builder stand-in holds
data only and runs the tree's ``build`` with every other method of the tree's builder class bound to it (0.32 moved
the FULL-graph staging into ``_stage_spec_decode`` and ``_stage_decode``)."""

from __future__ import annotations

import pytest
import torch
import tq_harness
import zero_draft
from zero_draft import (  # noqa: F401 (collected here)
    test_gdn_runs_a_step_of_zero_draft_rows_on_the_speculative_path,
    test_gdn_starts_decodes_without_drafts_from_the_accepted_state,
    test_runner_keeps_decodes_without_drafts_on_the_speculative_path,
)

pytestmark = [pytest.mark.integration, pytest.mark.patch("gdn-zero-draft-decodes-on-the-spec-path")]


@pytest.fixture
def tree(v025_tree):
    return v025_tree


@pytest.fixture(autouse=True)
def _builder_with_the_trees_methods(monkeypatch):
    original = zero_draft._builder

    def builder(tree, num_spec):
        build = original(tree, num_spec)
        tq_harness.bind_tree_methods(build.__self__, tree, zero_draft.GDN_ATTN, "GDNAttentionMetadataBuilder",
                                     torch=torch)
        return build

    monkeypatch.setattr(zero_draft, "_builder", builder)
