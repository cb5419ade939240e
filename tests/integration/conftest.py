"""Fixtures on the real vLLM 0.20.0 (the pin of release line v0.20): the PyPI sdist and wheel, fetched once
into the user's cache by the tool's own downloader (sha256-checked) and reused across runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from realvllm import ambiguous_steps, make_series, make_venv, sample_series_steps
from vllm_patch.infrastructure.downloads import fetch, pinned_base_tree
from vllm_patch.lines import line_named

PROJECT = Path(__file__).resolve().parents[2]
# The line whose release (0.20.0) the sample series of tests/support/realvllm.py edit.
LINE = "v0.20"


@pytest.fixture(scope="session")
def pin():
    return line_named(PROJECT, LINE).load().pin


@pytest.fixture(scope="session")
def sdist_tree(pin) -> Path:
    return pinned_base_tree(pin, quiet=True)


@pytest.fixture(scope="session")
def wheel_file(pin) -> Path:
    return fetch(pin.wheel, quiet=True)


@pytest.fixture(scope="session")
def real_series(sdist_tree, tmp_path_factory) -> Path:
    base, steps = sample_series_steps(sdist_tree)
    return make_series(tmp_path_factory.mktemp("real") / "series", base, steps)


@pytest.fixture(scope="session")
def ambiguous_series(sdist_tree, tmp_path_factory) -> Path:
    base, steps = ambiguous_steps(sdist_tree)
    return make_series(tmp_path_factory.mktemp("amb") / "series", base, steps)


@pytest.fixture(scope="session")
def venv_python(wheel_file, tmp_path_factory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "venv", wheel_file)
