"""Patch 0006 on 0.25.1: decodes without drafts stay speculative rows (tests/lines/zero_draft.py)."""

from __future__ import annotations

import pytest
from zero_draft import (  # noqa: F401 (collected here)
    test_gdn_runs_a_step_of_zero_draft_rows_on_the_speculative_path,
    test_gdn_starts_decodes_without_drafts_from_the_accepted_state,
    test_runner_keeps_decodes_without_drafts_on_the_speculative_path,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def tree(v025_tree):
    return v025_tree
