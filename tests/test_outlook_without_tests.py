"""outlook where the project's tests cannot run: from an installed tool (the lines bundled as package data,
no ``tests/``) the text checks run and the test checks are reported as not run; in a checkout whose
environment lacks what the tests need, one line names the command that makes outlook work."""

from __future__ import annotations

from click.testing import CliRunner

from helpers import build_series, snapshot
from test_obsolete import PASSING
from test_outlook import OLD, patched_layer, upstream  # noqa: F401 - the fixture
from vllm_patch.cli import main
from vllm_patch.lifecycle import obsolete
from vllm_patch.lifecycle.outlook import build_outlook
from vllm_patch.report import outlook_dict
from vllm_patch.series import load_series

# Part [text] holds on 0.21.0 by its text check alone; part [test] also needs a test; patch 0002 is obsolete there.
TRAILERS = ('Origin: vendor\nObsolete-If: [text] vllm/layers/layer.py contains "# upstream note"\n'
            'Obsolete-If: [test] vllm/layers/layer.py contains "# upstream note"\n'
            'Obsolete-If: [test] test "tests/test_p.py::test_ok"\n')


def series_without_tests(tmp_path):
    """A series as the installed tool bundles it: series and patches/, no tests/."""
    root = build_series(tmp_path / "s", OLD, [("fix", {"vllm/layer.py": patched_layer()})], trailers=TRAILERS)
    return root


def test_the_bundled_lines_run_the_text_checks_and_report_the_test_checks_not_run(upstream, tmp_path):  # noqa: F811
    repo, cache = upstream
    root = series_without_tests(tmp_path)
    assert not (root / "tests").exists()
    result = build_outlook(load_series(root), cache, ["0.21.0"], repo=str(repo), root=root)
    cell = result.rows[0].stacked["0001-fix.patch"]
    assert cell.state == "moved" and "partly obsolete: text (" in cell.partly and "still needed: test" in cell.partly
    notes = " ".join(outlook_dict(result)["notes"])
    assert 'Obsolete-If: [test] test "tests/test_p.py::test_ok"' in notes and "did not run" in notes, notes
    assert "checkout" in notes and "make dev" in notes, notes


def test_outlook_from_the_cli_with_the_bundled_lines(upstream, tmp_path, monkeypatch):  # noqa: F811
    repo, _ = upstream
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    root = series_without_tests(tmp_path)
    before = snapshot(root)
    done = CliRunner().invoke(main, ["--series", str(root), "outlook", "--releases", "0.21.0", "--repo", str(repo),
                                     "--json"])
    assert done.exit_code == 0, done.stderr
    assert "did not run" in done.stdout and "does not exist" not in done.stderr
    assert snapshot(root) == before


def test_a_checkout_without_the_test_environment_names_the_command(upstream, tmp_path, monkeypatch):  # noqa: F811
    repo, _ = upstream
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(obsolete, "TEST_MODULES", ("pytest", "surely_not_installed_vp", "torch", "triton"),
                        raising=False)
    root = series_without_tests(tmp_path)
    (root / "tests").mkdir()
    (root / "tests" / "test_p.py").write_text(PASSING)
    done = CliRunner().invoke(main, ["--series", str(root), "outlook", "--releases", "0.21.0", "--repo", str(repo)])
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.exit_code == 2 and len(errors) == 1, done.stderr
    assert "surely_not_installed_vp" in errors[0] and f"make -C {root} dev" in errors[0], errors
    assert f"{root}/.venv/bin/vllm-patch" in errors[0], errors


def test_a_checkout_with_the_environment_still_runs_the_test_checks(upstream, tmp_path, monkeypatch):  # noqa: F811
    repo, cache = upstream
    monkeypatch.setattr(obsolete, "TEST_MODULES", ("pytest",), raising=False)
    root = series_without_tests(tmp_path)
    (root / "tests").mkdir()
    (root / "tests" / "test_p.py").write_text(PASSING)
    result = build_outlook(load_series(root), cache, ["0.21.0"], repo=str(repo), root=root)
    assert result.rows[0].stacked["0001-fix.patch"].state == "obsolete"
    assert not any("did not run" in n for n in result.notes)
