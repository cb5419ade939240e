"""Patch 0006 on 0.25.1: with a drafter configured, a decode that got no drafts is a speculative row with zero
drafts, so the GDN layers continue its state from the slot of the last accepted token (see
tests/lines/zero_draft.py for how the tree's runner and builder are run).

On the release, Model Runner V1 (the hybrids' default) takes the speculative path only in steps where some request
has drafts (``gpu_model_runner.py`` ``use_spec_decode = len(scheduled_spec_decode_tokens) > 0``), marks decodes
without drafts -1 (plain rows), and the GDN builder runs a step whose rows drafted nothing as a plain batch; both
send such rows to ``block_table[:, 0]``, a stale state whenever the previous step accepted more than one token.
Ngram leaves rows and whole steps without drafts whenever the prompt has no match."""

from __future__ import annotations

import pytest
import zero_draft

pytestmark = pytest.mark.integration


def test_runner_keeps_decodes_without_drafts_on_the_speculative_path(v025_tree):
    zero_draft.check_runner_keeps_decodes_without_drafts_speculative(v025_tree)


def test_gdn_starts_decodes_without_drafts_from_the_accepted_state(v025_tree):
    zero_draft.check_gdn_starts_decodes_without_drafts_from_the_accepted_state(v025_tree)


def test_gdn_runs_a_step_of_zero_draft_rows_on_the_speculative_path(v025_tree):
    zero_draft.check_gdn_runs_a_step_of_zero_draft_rows_speculatively(v025_tree)
