"""``Obsolete-If:`` trailers: what is a valid one, which tests may run, and a check that cannot
run is an error, never a verdict (tool/vllm_patch/lifecycle/obsolete.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import build_series, snapshot
from test_outlook import OLD, patched_layer, upstream  # noqa: F401 - the fixture
from vllm_patch.cli import main
from vllm_patch.engine.patchfile import parse_patch
from vllm_patch.errors import InputError, VllmPatchError
from vllm_patch.infrastructure.verdict_cache import VerdictCache, code_digest, tree_digest
from vllm_patch.lifecycle.obsolete import Judge, conditions, project_test_runner
from vllm_patch.lifecycle.outlook import build_outlook
from vllm_patch.series import load_series

DIFF = "diff --git a/f b/f\nindex 1..2 100644\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
PASSING = "def test_ok():\n    assert True\n\n\ndef test_bad():\n    assert False\n"


def patch_with(*trailers: str):
    header = "From: a <a@b>\nSubject: [PATCH] x\n\nWhy.\n\nOrigin: vendor\n" + \
        "".join(f"Obsolete-If: {t}\n" for t in trailers) + "\n---\n"
    return parse_patch("0001-x.patch", (header + DIFF).encode())


def series_with(tmp_path: Path, trailer: str) -> Path:
    """A series of one patch carrying `trailer`, in a project with a tests/ folder."""
    root = build_series(tmp_path / "s", OLD, [("fix", {"vllm/layer.py": patched_layer()})],
                        trailers=f"Origin: vendor\nObsolete-If: {trailer}\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_p.py").write_text(PASSING)
    return root


@pytest.mark.parametrize("trailer, why", [
    ('../vllm/a.py contains "x"', "unsafe path"),
    ('/etc/passwd contains "root"', "unsafe path"),
    ('vllm\\a.py matches "x"', "unsafe path"),
    ('test "/any/path.py"', "tests/"),
    ('test "tests/../evil.py::t"', "unsafe path"),
    ('test "other/test_x.py::t"', "tests/"),
    ('test "-p evil"', "tests/"),
    ('test "tests/test_x.txt"', ".py"),
])
def test_invalid_trailer_is_bad_input(trailer, why):
    with pytest.raises(InputError, match="0001-x.patch") as caught:
        conditions(patch_with(trailer))
    assert why in caught.value.message and "\n" not in caught.value.message, caught.value.message


def evil_file(tmp_path: Path) -> tuple[Path, Path]:
    """A Python file that leaves a mark when anything imports or runs it."""
    mark = tmp_path / "ran"
    evil = tmp_path / "elsewhere" / "evil.py"
    evil.parent.mkdir()
    evil.write_text(f"open({str(mark)!r}, 'w').write('ran')\n\ndef test_x():\n    pass\n")
    return evil, mark


@pytest.mark.parametrize("where", ["absolute", "dotdot", "symlink"])
def test_outlook_never_runs_a_file_outside_the_projects_tests(upstream, tmp_path, where):  # noqa: F811
    repo, cache = upstream
    evil, mark = evil_file(tmp_path)
    node = {"absolute": str(evil), "dotdot": "tests/../../elsewhere/evil.py", "symlink": "tests/link_test.py"}[where]
    root = series_with(tmp_path, f'test "{node}"')
    (root / "tests" / "link_test.py").symlink_to(evil)
    with pytest.raises(InputError, match="Obsolete-If"):
        build_outlook(load_series(root), cache, ["0.21.0"], repo=str(repo), root=root)
    assert not mark.exists()


def test_a_test_that_does_not_exist_is_an_invalid_trailer(upstream, tmp_path):  # noqa: F811
    repo, cache = upstream
    root = series_with(tmp_path, 'test "tests/test_missing.py::test_ok"')
    with pytest.raises(InputError, match="test_missing.py.* does not exist"):
        build_outlook(load_series(root), cache, ["0.21.0"], repo=str(repo), root=root)


def judge_of(root: Path, tree: Path) -> Judge:
    """A judge whose verdicts are kept in a cache of the test's own, so every test runs its checks."""
    return Judge(lambda paths: {}, project_test_runner(root, lambda: tree, VerdictCache(root / ".verdicts")))


def test_a_test_node_that_does_not_exist_is_an_error_not_a_verdict(tmp_path):
    root = series_with(tmp_path, 'test "tests/test_p.py::test_nope"')
    with pytest.raises(VllmPatchError, match="test_nope") as caught:
        judge_of(root, tmp_path).obsolete(load_series(root).patches[0])
    assert "cannot run" in caught.value.message and caught.value.exit_code == 2


def test_without_pytest_a_test_check_is_an_error_not_a_verdict(tmp_path, monkeypatch):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    root = series_with(tmp_path, 'test "tests/test_p.py::test_ok"')
    monkeypatch.setattr(sys, "executable", str(bare / "bin" / "python"))
    with pytest.raises(VllmPatchError, match="pytest is not installed") as caught:
        judge_of(root, tmp_path).obsolete(load_series(root).patches[0])
    assert "cannot run" in caught.value.message and caught.value.exit_code == 2


def test_without_a_runner_a_test_check_is_an_error_not_a_verdict():
    with pytest.raises(VllmPatchError, match="cannot run"):
        Judge(lambda paths: {}).obsolete(patch_with('test "tests/test_p.py::test_ok"'))


def test_a_test_that_runs_gives_the_verdict(tmp_path):
    root = series_with(tmp_path, 'test "tests/test_p.py::test_ok"')
    assert judge_of(root, tmp_path).obsolete(load_series(root).patches[0])
    root = series_with(tmp_path / "b", 'test "tests/test_p.py::test_bad"')
    assert judge_of(root, tmp_path).obsolete(load_series(root).patches[0]) is None


@pytest.mark.parametrize("command", [["outlook", "--releases", "0.21.0"], ["rebase", "v0.21.0"]])
def test_invalid_trailer_is_one_line_exit_2_from_the_commands(upstream, tmp_path, monkeypatch, command):  # noqa: F811
    repo, _ = upstream
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    evil, mark = evil_file(tmp_path)
    root = series_with(tmp_path, f'test "{evil}"')
    before = snapshot(root)
    result = CliRunner().invoke(main, ["--series", str(root), *command, "--repo", str(repo)])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Obsolete-If" in errors[0] and "0001-fix.patch" in errors[0], result.stderr
    assert snapshot(root) == before and not mark.exists() and not os.path.exists(root / ".vllm-patch-rebase")


def test_labelled_checks_make_parts():
    patch = patch_with('[graph safety] vllm/a.py contains "safe"', '[speed] vllm/a.py contains "fast"',
                       '[ graph   safety ] vllm/b.py matches "^ok$"')
    conds = conditions(patch)
    assert [(c.part, c.path) for c in conds] == [("graph safety", "vllm/a.py"), ("speed", "vllm/a.py"),
                                                 ("graph safety", "vllm/b.py")]
    assert conditions(patch_with('vllm/a.py contains "x"'))[0].part == "whole"
    with pytest.raises(InputError, match="malformed"):
        conditions(patch_with("[speed] whenever"))


@pytest.mark.parametrize("a, b, held, pending", [
    ("safe fast", "ok", ("graph safety", "speed"), ()),
    ("safe", "ok", ("graph safety",), ("speed",)),
    ("safe fast", "no", ("speed",), ("graph safety",)),  # one failing check fails its whole part
    ("", "ok", None, None),
])
def test_a_patch_is_obsolete_when_every_part_holds_and_partly_when_some_do(a, b, held, pending):
    patch = patch_with('[graph safety] vllm/a.py contains "safe"', '[speed] vllm/a.py contains "fast"',
                       '[graph safety] vllm/b.py matches "^ok$"')
    files = {"vllm/a.py": a.encode(), "vllm/b.py": b.encode()}
    judge = Judge(lambda paths: {p: files.get(p) for p in paths})
    found = judge.judge(patch)
    if held is None:
        assert found is None and judge.obsolete(patch) is None
        return
    assert (found.held, found.pending) == (held, pending)
    assert (judge.obsolete(patch) is not None) == (not pending)
    if pending:
        text = found.describe()
        assert text.startswith(f"partly obsolete: {held[0]} (") and text.endswith(f"still needed: {pending[0]}")


def test_a_test_check_is_given_the_base_under_test(tmp_path):
    root = series_with(tmp_path, 'test "tests/test_env.py::test_base"')
    base = tmp_path / "base"
    base.mkdir()
    (root / "tests" / "test_env.py").write_text(
        f"import os\n\ndef test_base():\n    assert os.environ['VLLM_PATCH_BASE_UNDER_TEST'] == {str(base)!r}\n")
    assert judge_of(root, base).obsolete(load_series(root).patches[0])


def test_many_checks_run_in_one_pytest_run_with_a_verdict_each(tmp_path, monkeypatch):
    root = series_with(tmp_path, 'test "tests/test_p.py::test_ok"')
    (root / "tests" / "test_q.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('x', [1, 2])\ndef test_some(x):\n    assert x == 1\n\n\n"
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_all(x):\n    assert x\n")
    runs = []
    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: runs.append(a) or real(*a, **k))
    nodes = ["tests/test_p.py::test_ok", "tests/test_p.py::test_bad", "tests/test_q.py::test_some",
             "tests/test_q.py::test_all"]
    got = project_test_runner(root, lambda: tmp_path, VerdictCache(tmp_path / "verdicts")).many(nodes)
    assert len(runs) == 1
    assert {n: ok for n, (ok, _) in got.items()} == dict(zip(nodes, [True, False, False, True], strict=True))
    assert "2 tests, 1 failure" in got["tests/test_q.py::test_some"][1]


def test_judge_prepares_every_patchs_checks_in_one_run(tmp_path, monkeypatch):
    root = series_with(tmp_path, '[a] test "tests/test_p.py::test_ok"')
    patch = patch_with('[a] test "tests/test_p.py::test_ok"', '[b] test "tests/test_p.py::test_bad"')
    runs = []
    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: runs.append(a) or real(*a, **k))
    judge = judge_of(root, tmp_path)
    judge.prepare([patch])
    found = judge.judge(patch)
    assert len(runs) == 1 and (found.held, found.pending) == (("a",), ("b",))


def test_a_verdict_is_kept_for_the_same_tree_and_tests_and_given_again_when_either_changes(tmp_path, monkeypatch):
    root = series_with(tmp_path, 'test "tests/test_p.py::test_ok"')
    base = tmp_path / "base"
    base.mkdir()
    (base / "f.py").write_text("x = 1\n")
    runs = []
    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: runs.append(a) or real(*a, **k))
    verdicts = VerdictCache(tmp_path / "verdicts")

    def ask():
        return project_test_runner(root, lambda: base, verdicts)("tests/test_p.py::test_ok")

    assert ask()[0] and len(runs) == 1
    again = ask()
    assert again[0] and "cached" in again[1] and len(runs) == 1
    tree_digest.cache_clear()
    (base / "f.py").write_text("x = 2\n")  # another tree
    assert ask()[0] and len(runs) == 2
    code_digest.cache_clear()
    (root / "tests" / "test_p.py").write_text("def test_ok():\n    assert False\n")  # other test code
    assert not ask()[0] and len(runs) == 3
    monkeypatch.setenv("VLLM_PATCH_NO_VERDICT_CACHE", "1")
    assert not project_test_runner(root, lambda: base, VerdictCache(tmp_path / "verdicts"))(
        "tests/test_p.py::test_ok")[0] and len(runs) == 4


def test_the_verdicts_cover_every_harness_module_a_line_test_imports():
    """A line's test that imports a module of gpu/harness the verdict key leaves out would keep stale verdicts
    when that module changes."""
    import re

    from vllm_patch.infrastructure.verdict_cache import IMPORTED, _unrelated

    tests = Path(__file__).resolve().parent
    imported = set()
    for path in tests.rglob("*.py"):
        if _unrelated(path.relative_to(tests)):
            continue
        for module in re.findall(r"^\s*(?:from|import) harness(?:\.(\w+))?", path.read_text(), re.M):
            imported.add(f"gpu/harness/{module or '__init__'}.py")
    assert imported, "no line test imports the harness: the search itself is broken"
    assert imported <= set(IMPORTED)


def test_a_change_to_the_imported_harness_module_changes_the_key(tmp_path):
    project = tmp_path / "p"
    (project / "tests").mkdir(parents=True)
    (project / "gpu" / "harness").mkdir(parents=True)
    models = project / "gpu" / "harness" / "models.py"
    models.write_text("A = 1\n")
    (project / "gpu" / "harness" / "serve.py").write_text("B = 1\n")
    code_digest.cache_clear()
    before = code_digest(project)
    (project / "gpu" / "harness" / "serve.py").write_text("B = 2\n")  # GPU tooling: same verdicts
    code_digest.cache_clear()
    assert code_digest(project) == before
    models.write_text("A = 2\n")
    code_digest.cache_clear()
    assert code_digest(project) != before
    code_digest.cache_clear()
