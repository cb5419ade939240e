"""Model Runner V2's steps named for the profiler, as Model Runner V1 names its own.

vLLM's Model Runner V1 opens ``gpu_model_runner: forward``, ``... draft`` and ``... sample`` ranges when
``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1``; Model Runner V2 (0.33's default) opens none, so every kernel of a profiled
V2 step would land outside any stage. ``install`` wraps the V2 runner's ``execute_model`` (input preparation and
the target's forward), its ``sample`` (logits, sampler and rejection) and ``propose`` of every V2 speculator class
in ``torch.profiler.record_function`` ranges of those names, open only inside ``opened()``: the timed runs
keep the release's own calls but for one flag test. harness.breakdown maps the names to stages.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable

from harness.methods import speculator_classes, wrap_once

EXECUTE = "gpu_model_runner: execute_model"
SAMPLE = "gpu_model_runner: sample"
DRAFT = "gpu_model_runner: draft"

_STATE = {"active": False}


def _scoped(name: str) -> Callable[[Callable], Callable]:
    def wrapper(method: Callable) -> Callable:
        @functools.wraps(method)
        def scoped(self, *args, **kwargs):
            if not _STATE["active"]:
                return method(self, *args, **kwargs)
            import torch

            with torch.profiler.record_function(name):
                return method(self, *args, **kwargs)

        return scoped

    return wrapper


def wrap(targets: Iterable[tuple[type, str, str]]) -> int:
    """Wrap each (class, method, range name) where the class itself defines the method (once); how many are."""
    return sum(wrap_once(cls, method, _scoped(name), "__vp_scope__") for cls, method, name in targets)


def install() -> int:
    """Wrap Model Runner V2's steps and speculators; 0 where this vLLM has no Model Runner V2."""
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    except ImportError:
        return 0
    targets = [(GPUModelRunner, "execute_model", EXECUTE), (GPUModelRunner, "sample", SAMPLE)]
    targets += [(cls, "propose", DRAFT) for cls in speculator_classes()]
    return wrap(targets)


@contextlib.contextmanager
def opened():
    """The ranges open while the block runs."""
    _STATE["active"] = True
    try:
        yield
    finally:
        _STATE["active"] = False
