"""Model Runner V2's steps named for the profiler, as Model Runner V1 names its own.

vLLM's Model Runner V1 opens ``gpu_model_runner: forward``, ``... draft`` and ``... sample`` ranges when
``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1``; Model Runner V2 (0.33's default) opens none, so every kernel of a profiled
V2 step would land outside any stage. ``install`` wraps the V2 runner's ``execute_model`` (input preparation and
the target's forward), its ``sample`` (logits, sampler and rejection) and ``propose`` of every V2 speculator class
in ``torch.profiler.record_function`` ranges of those names, open only while ``active`` is set: the timed runs
keep the release's own calls but for one flag test. harness.breakdown maps the names to stages.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable

EXECUTE = "gpu_model_runner: execute_model"
SAMPLE = "gpu_model_runner: sample"
DRAFT = "gpu_model_runner: draft"

_STATE = {"active": False}


def active(on: bool) -> None:
    """Open the ranges from now on (True) or stop opening them (False)."""
    _STATE["active"] = on


def _wrap(method: Callable, name: str) -> Callable:
    @functools.wraps(method)
    def scoped(self, *args, **kwargs):
        if not _STATE["active"]:
            return method(self, *args, **kwargs)
        import torch

        with torch.profiler.record_function(name):
            return method(self, *args, **kwargs)

    scoped.__vp_scope__ = name
    return scoped


def wrap(targets: Iterable[tuple[type, str, str]]) -> int:
    """Wrap each (class, method, range name) where the class itself defines the method (once); how many are."""
    count = 0
    for cls, method, name in targets:
        found = cls.__dict__.get(method)
        if found is None:
            continue
        if getattr(found, "__vp_scope__", None) is None:
            setattr(cls, method, _wrap(found, name))
        count += 1
    return count


def install() -> int:
    """Wrap Model Runner V2's steps and speculators; 0 where this vLLM has no Model Runner V2."""
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    except ImportError:
        return 0
    from harness.drafts import _speculator_classes

    targets = [(GPUModelRunner, "execute_model", EXECUTE), (GPUModelRunner, "sample", SAMPLE)]
    targets += [(cls, "propose", DRAFT) for cls in _speculator_classes()]
    return wrap(targets)


@contextlib.contextmanager
def opened():
    """The ranges open while the block runs."""
    active(True)
    try:
        yield
    finally:
        active(False)
