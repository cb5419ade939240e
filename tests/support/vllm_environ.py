"""vLLM's own check of its environment variables, run on a tree's files without importing vLLM.

At start-up vLLM's engine arguments call ``validate_environ(hard_fail)``: every ``VLLM_*`` variable in the
environment must be registered in ``vllm/envs.py`` (``environment_variables``); an unknown one is logged
("Unknown vLLM environment variable detected") or, with ``fail_on_environ_validation``, refused with a
``ValueError``. Releases up to 0.27 define the check in ``vllm/envs.py``, later ones as
``Platform.validate_environ`` in ``vllm/platforms/interface.py``; both read the tree's own ``envs``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import vllm_tree

__all__ = ["envs_module", "only_vllm_variables", "validate_environ"]

ENVS = "vllm/envs.py"
PLATFORM = "vllm/platforms/interface.py"


def envs_module(tree: Path) -> ModuleType:
    """The tree's ``vllm/envs.py``, loaded once per tree (its variables are read when asked for)."""
    return vllm_tree.load_module(tree, ENVS)


def validate_environ(tree: Path, hard_fail: bool = True) -> None:
    """Run the tree's own check of the ``VLLM_*`` variables of this process's environment."""
    envs = envs_module(tree)
    if hasattr(envs, "validate_environ"):
        envs.validate_environ(hard_fail)
        return
    method = vllm_tree.load_function(tree, PLATFORM, "Platform.validate_environ", os=os,
                                     logger=logging.getLogger("vllm.platforms.interface"))
    method.__func__(None, hard_fail)  # a classmethod that uses no class attribute


def only_vllm_variables(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """A setter of the environment's ``VLLM_*`` variables: ``set_only(NAME=value, ...)`` leaves those and no
    other (the test run's own, such as ``VLLM_PATCH_*``, are not vLLM's and would fail the check)."""

    def set_only(**values: str) -> None:
        for name in [name for name in os.environ if name.startswith("VLLM_")]:
            monkeypatch.delenv(name)
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_only
