"""Line v0.27's own patch (0005) judges by behaviour, as the current line's do (tests/lines/v0_33 judges
0001-0004 on this line with ``VLLM_PATCH_V033_LINE=v0.27``): its ``Obsolete-If: test`` check, run the way
``outlook`` and ``rebase`` run it, calls it still needed on 0.27.1 and obsolete on a tree that has the fix."""

from __future__ import annotations

import pytest

from vllm_patch.lifecycle.obsolete import Judge, conditions, project_test_runner
from vllm_trees import PROJECT

OWN = ("0005-gdn-align-the-gates-with-their-tokens-in-mixed-batches.patch",)


def _reader(root):
    return lambda paths: {p: (root / p).read_bytes() if (root / p).is_file() else None for p in paths}


@pytest.mark.integration
@pytest.mark.parametrize("name", OWN)
def test_still_needed_on_the_release_and_obsolete_where_the_fix_is(v027_series, v027_pristine_tree, v027_tree,
                                                                    name):
    patch = next(p for p in v027_series.patches if p.name == name)
    conds = conditions(patch)
    assert conds and all(c.op == "test" for c in conds), f"{name}: {[c.source for c in conds]}"
    verdicts = {}
    for label, tree in (("release", v027_pristine_tree), ("line", v027_tree)):
        judge = Judge(_reader(tree), project_test_runner(PROJECT, lambda t=tree: t))
        judge.prepare([patch])
        verdicts[label] = judge.judge(patch)
    assert verdicts["release"] is None, f"{name} on {v027_series.pin.version}: {verdicts['release'].describe()}"
    assert verdicts["line"] is not None and verdicts["line"].whole, \
        f"{name} with the line: {verdicts['line'].describe() if verdicts['line'] else 'no part holds'}"
