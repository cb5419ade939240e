"""harness.methods.wrap_once: a wrapper of each kind installed once, on the class that defines the method."""

from __future__ import annotations

import functools

from harness.methods import wrap_once


def _tagging(tag: str, calls: list[str]):
    def wrapper(method):
        @functools.wraps(method)
        def wrapped(self, *args):
            calls.append(tag)
            return method(self, *args)

        return wrapped

    return wrapper


def test_two_kinds_stack_once_each_in_either_order():
    for order in (("a", "b"), ("b", "a")):
        calls: list[str] = []

        class C:
            def f(self, x):
                return x + 1

        for _ in range(2):  # installing again changes nothing
            for tag in order:
                assert wrap_once(C, "f", _tagging(tag, calls), f"__{tag}__")
        assert C().f(1) == 2
        assert calls == list(reversed(order))


def test_a_subclass_that_inherits_the_method_is_left_alone():
    class C:
        def f(self):
            return 1

    class D(C):
        pass

    assert not wrap_once(D, "f", _tagging("a", []), "__a__")
    assert "f" not in D.__dict__
