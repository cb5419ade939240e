"""The current line's drop conditions judge behaviour: every patch carries ``Obsolete-If: test`` checks, and run
the way ``outlook`` and ``rebase`` run them (pytest on an unpatched base named by $VLLM_PATCH_BASE_UNDER_TEST)
they call no part of any patch obsolete on 0.33.0 and every patch wholly obsolete on a tree that has the line's
fixes. (How each reads on trees written the way the open upstream PRs fix the same bugs:
test_upstream_outlook.py.)"""

from __future__ import annotations

import shutil

import pytest

from vllm_patch.lifecycle.obsolete import Judge, conditions, project_test_runner
from vllm_trees import PROJECT

UQ = "vllm/v1/attention/backends/ultraquant_attn.py"


def _reader(root):
    return lambda paths: {p: (root / p).read_bytes() if (root / p).is_file() else None for p in paths}


@pytest.fixture(scope="module")
def judges(v033_series, v033_pristine_tree, v033_tree):
    """One judge a tree, its test checks run as outlook runs them: all at once."""
    out = {}
    for name, tree in (("release", v033_pristine_tree), ("line", v033_tree)):
        out[name] = Judge(_reader(tree), project_test_runner(PROJECT, lambda t=tree: t))
        out[name].prepare(list(v033_series.patches))
    return out


def test_every_patch_judges_by_behaviour(v033_series):
    for patch in v033_series.patches:
        conds = conditions(patch)
        assert conds and all(c.op == "test" for c in conds), f"{patch.name}: {[c.source for c in conds]}"


HERE = "tests/lines/v0_33/"


def _shared(series) -> list:
    """The line's patches judged by this directory's tests: all of the current line's; on a line that carries
    its fixes to an earlier release, those fixes (the line's own patches have tests of their own)."""
    return [p for p in series.patches if all(c.text.startswith(HERE) for c in conditions(p))]


@pytest.mark.integration
@pytest.mark.slow  # pytest on two trees a line, as outlook runs the checks
def test_still_needed_on_the_release_and_obsolete_where_the_fix_is(v033_series, judges):
    shared = _shared(v033_series)
    assert len(shared) >= 5, [p.name for p in shared]
    problems = []
    for patch in shared:
        on_release = judges["release"].judge(patch)
        if on_release is not None:
            problems.append(f"{patch.name} on {v033_series.pin.version}: {on_release.describe()}")
        on_line = judges["line"].judge(patch)
        if on_line is None or not on_line.whole:
            problems.append(f"{patch.name} with the line: {on_line.describe() if on_line else 'no part holds'}")
    assert not problems, "\n".join(problems)


@pytest.mark.integration
@pytest.mark.slow  # pytest on one tree, as outlook runs the checks
def test_ultraquant_checks_read_obsolete_on_a_base_without_ultraquant(v033_series, v033_pristine_tree, tmp_path):
    """A new base without UltraQuant leaves 0001 nothing to fix there: its UltraQuant checks pass (a skip would be
    no verdict, and the part could never read obsolete), while its TurboQuant checks still fail as on the release."""
    [first] = [p for p in v033_series.patches if p.name.startswith("0001-")]
    nodes = [c.text for c in conditions(first)]
    if not any("ultraquant" in n for n in nodes):
        pytest.skip(f"{first.name} of this line has no UltraQuant check: its release has no UltraQuant")
    tree = tmp_path / "no-ultraquant"
    shutil.copytree(v033_pristine_tree, tree, symlinks=True)
    (tree / UQ).unlink()
    verdicts = project_test_runner(PROJECT, lambda: tree).many(nodes)
    ultraquant = [n for n in nodes if "ultraquant" in n]
    turboquant = [n for n in nodes if "turboquant" in n]
    assert ultraquant and all(verdicts[n][0] for n in ultraquant), {n: verdicts[n] for n in ultraquant}
    assert turboquant and not any(verdicts[n][0] for n in turboquant), {n: verdicts[n] for n in turboquant}
