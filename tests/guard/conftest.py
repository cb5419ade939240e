from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from guardenv import guard_setup  # noqa: E402


@pytest.fixture(scope="session")
def setup_module():
    """``guard/setup.py`` (its build-time data generator) and, through it, the guard's source package."""
    return guard_setup()
