"""Line v0.27's own patches (0005-0007) judge by behaviour, as the current line's do (tests/lines/v0_33 judges
0001-0004 on this line with ``VLLM_PATCH_V033_LINE=v0.27``): their ``Obsolete-If: test`` checks, run the way
``outlook`` and ``rebase`` run them, call each still needed on 0.27.1 and obsolete on a tree that has the fix:
the line's own, and the unpatched trees of the later releases that have it upstream (all three, whole, from
0.32.0)."""

from __future__ import annotations

import pytest

from vllm_patch.infrastructure.downloads import pinned_base_tree
from vllm_patch.lines import line_for
from vllm_trees import PROJECT, assert_needed_then_obsolete, obsolete_verdicts

OWN = (
    "0005-gdn-align-the-gates-with-their-tokens-in-mixed-batches.patch",
    "0006-gdn-zero-draft-decodes-on-the-spec-path.patch",
    "0007-v2-prompt-chunks-out-of-uniform-decode-graphs.patch",
)


@pytest.mark.integration
@pytest.mark.slow  # pytest on each tree, as outlook runs the checks
@pytest.mark.parametrize("name", OWN)
def test_still_needed_on_the_release_and_obsolete_where_the_fix_is(v027_series, v027_pristine_tree, v027_tree,
                                                                    name):
    assert_needed_then_obsolete(v027_series, name, v027_pristine_tree, v027_tree)


# The releases whose unpatched trees have each patch's fix (the pins of the lines that carry them).
FIXED_IN = {
    "0005-gdn-align-the-gates-with-their-tokens-in-mixed-batches.patch": ('0.32.0', '0.33.0'),
    "0006-gdn-zero-draft-decodes-on-the-spec-path.patch": ('0.32.0', '0.33.0'),
    "0007-v2-prompt-chunks-out-of-uniform-decode-graphs.patch": ('0.32.0', '0.33.0'),
}


@pytest.mark.integration
@pytest.mark.slow  # pytest on each tree, as outlook runs the checks
@pytest.mark.parametrize(("name", "version"), [(n, v) for n, vs in FIXED_IN.items() for v in vs])
def test_obsolete_on_the_releases_that_have_the_fix(v027_series, name, version):
    pin = line_for(PROJECT, version).load().pin
    verdict = obsolete_verdicts(v027_series, name, {version: pinned_base_tree(pin, quiet=True)})[version]
    assert verdict is not None and verdict.whole, (
        f"{name} on {version}: {verdict.describe() if verdict else 'no part holds'}: rebase and outlook would keep "
        f"it as still needed")
