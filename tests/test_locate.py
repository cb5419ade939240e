"""Where the series comes from: --series, $VLLM_PATCH_SERIES, the working directory and its
parents, the tool's own checkout, then the lines bundled with an installed tool."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from vllm_patch import __version__, locate
from vllm_patch.errors import InputError
from vllm_patch.locate import SeriesHome, find_home
from vllm_patch.series import load_series

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.fixture
def away(tmp_path, monkeypatch) -> Path:
    """An empty working directory, no $VLLM_PATCH_SERIES, and a tool installed outside any checkout."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    monkeypatch.delenv("VLLM_PATCH_SERIES", raising=False)
    monkeypatch.setattr(locate, "__file__", str(tmp_path / "site-packages" / "vllm_patch" / "locate.py"))
    monkeypatch.setattr(locate, "bundled_root", lambda: None)
    return empty


def test_the_order(two_patch_series, away, tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    shutil.copytree(two_patch_series, bundle)
    with pytest.raises(InputError, match="no series found"):
        find_home()
    monkeypatch.setattr(locate, "bundled_root", lambda: bundle)
    assert find_home() == SeriesHome(bundle, bundled=True)
    monkeypatch.setattr(locate, "__file__", str(CHECKOUT / "tool" / "vllm_patch" / "locate.py"))
    assert find_home() == SeriesHome(CHECKOUT)
    deep = two_patch_series / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert find_home() == SeriesHome(two_patch_series)
    monkeypatch.setenv("VLLM_PATCH_SERIES", str(bundle))
    assert find_home() == SeriesHome(bundle)
    assert find_home(tmp_path / "given") == SeriesHome(tmp_path / "given")


def test_describe_names_the_checkout_or_the_bundle(two_patch_series):
    series = load_series(two_patch_series)
    assert SeriesHome(two_patch_series).describe(two_patch_series, series) == \
        f"series {series.digest} from {two_patch_series}"
    assert SeriesHome(two_patch_series, bundled=True).describe(two_patch_series, series) == \
        f"series {series.digest} bundled with vllm-patch {__version__}"


def test_a_zipped_bundle_is_copied_out_once(two_patch_series, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    archive = tmp_path / "pkg.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(p for p in two_patch_series.rglob("*") if p.is_file()):
            zf.write(path, f"vllm_patch/_lines/{path.relative_to(two_patch_series)}")
    root = locate._extracted(zipfile.Path(archive, "vllm_patch/_lines/"))
    assert load_series(root).digest == load_series(two_patch_series).digest
    assert locate._extracted(zipfile.Path(archive, "vllm_patch/_lines/")) == root


def test_cli_series_says_where_it_came_from(two_patch_series):
    from helpers import run_cli

    shown = run_cli("--series", str(two_patch_series), "series")
    assert shown.returncode == 0, shown.stderr
    digest = load_series(two_patch_series).digest
    assert shown.stdout.splitlines()[0] == f"series {digest} from {two_patch_series}"


def test_the_bundled_series_is_read_only(two_patch_series):
    SeriesHome(two_patch_series).check_writable()
    with pytest.raises(InputError, match=f"bundled with vllm-patch {__version__} is read-only"):
        SeriesHome(two_patch_series, bundled=True).check_writable()


def test_commands_that_edit_the_series_refuse_the_bundled_one(two_patch_series, away, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from vllm_patch.cli import main

    monkeypatch.setattr(locate, "bundled_root", lambda: two_patch_series)
    before = {p: p.read_bytes() for p in two_patch_series.rglob("*") if p.is_file()}
    for args in (["rebase", "v0.21.0"], ["refresh", "0001-first-fix.patch", "--from", str(tmp_path)],
                 ["import", str(two_patch_series / "patches/0001-first-fix.patch")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert "is read-only" in result.output, args
    assert {p: p.read_bytes() for p in two_patch_series.rglob("*") if p.is_file()} == before
    shown = CliRunner().invoke(main, ["series"])
    assert shown.exit_code == 0 and "bundled with vllm-patch" in shown.output
