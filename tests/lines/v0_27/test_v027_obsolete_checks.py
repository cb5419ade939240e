"""Line v0.27's own patches (0005-0007) judge by behaviour, as the current line's do (tests/lines/v0_33 judges
0001-0004 on this line with ``VLLM_PATCH_V033_LINE=v0.27``): their ``Obsolete-If: test`` checks, run the way
``outlook`` and ``rebase`` run them, call each still needed on 0.27.1 and obsolete on a tree that has the fix."""

from __future__ import annotations

import pytest

from vllm_trees import assert_needed_then_obsolete

OWN = (
    "0005-gdn-align-the-gates-with-their-tokens-in-mixed-batches.patch",
    "0006-gdn-zero-draft-decodes-on-the-spec-path.patch",
    "0007-v2-prompt-chunks-out-of-uniform-decode-graphs.patch",
)


@pytest.mark.integration
@pytest.mark.parametrize("name", OWN)
def test_still_needed_on_the_release_and_obsolete_where_the_fix_is(v027_series, v027_pristine_tree, v027_tree,
                                                                    name):
    assert_needed_then_obsolete(v027_series, name, v027_pristine_tree, v027_tree)
