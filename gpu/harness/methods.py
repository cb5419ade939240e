"""Methods of vLLM's classes wrapped in the engine's process (harness.drafts records proposals, harness.scopes
names steps for the profiler): each wrapper is installed once, on the class that defines the method."""

from __future__ import annotations

from collections.abc import Callable


def wrap_once(cls: type, method: str, wrapper: Callable[[Callable], Callable], marker: str) -> bool:
    """Replace ``cls.method`` by ``wrapper(method)`` unless a wrapper of this ``marker`` is already there; whether
    ``cls`` itself defines the method (subclasses that inherit it are left alone). Markers travel with
    functools.wraps, so wrappers of two kinds stack once each, in either order."""
    found = cls.__dict__.get(method)
    if found is None:
        return False
    if not getattr(found, marker, False):
        wrapped = wrapper(found)
        setattr(wrapped, marker, True)
        setattr(cls, method, wrapped)
    return True


def speculator_classes() -> list[type]:
    """Model Runner V2's speculator base class and all its subclasses imported so far."""
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

    seen, todo = [], [BaseSpeculator]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(c for c in cls.__subclasses__() if c not in seen)
    return seen
